// Command skipper-testpod is the process of the e2e tests' pod image
// (make image: skipper-dev/testpod, at /testpod): the few things a test
// pod's containers do that an image without a shell cannot, each a
// subcommand whose exit status says how it went.
//
//	write FILE TEXT       write TEXT to FILE and exit (an init container)
//	sidecar FILE TEXT     write TEXT to FILE, then block until SIGTERM (a native sidecar)
//	exists FILE...        exit 0 if every FILE exists (an exec probe)
//	gather OUT FILE...    write the contents of every FILE, in order, to OUT,
//	                      then block until SIGTERM (the main container)
//	resolve NAME          resolve NAME with the pod's resolv.conf and write
//	                      its sorted addresses to /dev/termination-log
//	get URL...            GET each URL (names resolved with the pod's
//	                      resolv.conf), write "<status> <body>" of each, a
//	                      line apiece, to /dev/termination-log; exit 1 on a
//	                      failed request or a status that is not 200
//	serve ADDR            serve HTTP on ADDR until SIGTERM: what the kubelet
//	                      gave the pod (/env?k=, /file?path=, /whoami: the
//	                      in-cluster API's name for the pod's token), /healthz
//
// It has no Run: each subcommand is a few lines of the standard library,
// tested by the e2e tests that run it in real pods.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "skipper-testpod:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return errors.New("no command: want write, sidecar, exists, gather, resolve, get or serve")
	}
	cmd, args := args[0], args[1:]
	switch {
	case cmd == "write" && len(args) == 2:
		return os.WriteFile(args[0], []byte(args[1]), 0o644)
	case cmd == "sidecar" && len(args) == 2:
		if err := os.WriteFile(args[0], []byte(args[1]), 0o644); err != nil {
			return err
		}
		return block()
	case cmd == "exists" && len(args) > 0:
		for _, f := range args {
			if _, err := os.Stat(f); err != nil {
				return err
			}
		}
		return nil
	case cmd == "gather" && len(args) > 1:
		var b strings.Builder
		for _, f := range args[1:] {
			data, err := os.ReadFile(f)
			if err != nil {
				return err
			}
			b.Write(data)
			b.WriteByte('\n')
		}
		if err := os.WriteFile(args[0], []byte(b.String()), 0o644); err != nil {
			return err
		}
		return block()
	case cmd == "resolve" && len(args) == 1:
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		addrs, err := net.DefaultResolver.LookupHost(ctx, args[0])
		if err != nil {
			return err
		}
		slices.Sort(addrs)
		fmt.Println(strings.Join(addrs, " "))
		return os.WriteFile("/dev/termination-log", []byte(strings.Join(addrs, " ")), 0o644)
	case cmd == "get" && len(args) > 0:
		return get(args)
	case cmd == "serve" && len(args) == 1:
		return serve(args[0])
	}
	return fmt.Errorf("bad command line %q: want write FILE TEXT, sidecar FILE TEXT, exists FILE..., gather OUT FILE..., resolve NAME, get URL... or serve ADDR", append([]string{cmd}, args...))
}

// get GETs each URL in turn and writes what came back to the termination
// log (at most 4 KiB: the kubelet's bound), a line per URL.
func get(urls []string) error {
	client := &http.Client{Timeout: 20 * time.Second}
	var out strings.Builder
	var errs []error
	for _, u := range urls {
		resp, err := client.Get(u)
		if err != nil {
			errs = append(errs, err)
			fmt.Fprintf(&out, "error %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
			continue
		}
		body := make([]byte, 1024)
		n, _ := io.ReadFull(resp.Body, body)
		resp.Body.Close()
		fmt.Fprintf(&out, "%d %s\n", resp.StatusCode, strings.ReplaceAll(string(body[:n]), "\n", " "))
		if resp.StatusCode != http.StatusOK {
			errs = append(errs, fmt.Errorf("GET %s: %s", u, resp.Status))
		}
	}
	fmt.Print(out.String())
	msg := out.String()
	if len(msg) > 4096 {
		msg = msg[:4096]
	}
	if err := os.WriteFile("/dev/termination-log", []byte(msg), 0o644); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// serve answers what the kubelet gave the pod until SIGTERM or SIGINT.
func serve(addr string) error {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/env", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, os.Getenv(r.URL.Query().Get("k"))) })
	mux.HandleFunc("/file", func(w http.ResponseWriter, r *http.Request) {
		data, err := os.ReadFile(r.URL.Query().Get("path"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		w.Write(data)
	})
	mux.HandleFunc("/whoami", func(w http.ResponseWriter, r *http.Request) {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		res, err := cs.AuthenticationV1().SelfSubjectReviews().Create(r.Context(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprint(w, res.Status.UserInfo.Username)
	})
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }() // ends with Shutdown below
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	select {
	case err := <-errc:
		return err
	case <-sigs:
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(ctx)
}

// block returns when SIGTERM or SIGINT arrives.
func block() error {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	<-sigs
	return nil
}
