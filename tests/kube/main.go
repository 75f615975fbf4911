// Command kube is one multi-call binary holding the Kubernetes control-plane
// components, the kubelet, kubectl, kube-proxy and etcd, built from their Go modules so the
// local cluster needs nothing but the Go toolchain. The component is chosen by
// the name the binary is invoked as (a symlink such as bin/kube-apiserver) or,
// failing that, by the first argument: `kube kube-apiserver --help`.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	kubectl "k8s.io/kubectl/pkg/cmd"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

var components = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy", "kubelet", "kubectl"}

func main() {
	name := filepath.Base(os.Args[0])
	args := os.Args
	if !known(name) && len(os.Args) > 1 && known(os.Args[1]) {
		name, args = os.Args[1], os.Args[1:]
	}
	// The components read their flags from os.Args (cobra's default), so
	// it is set to what they would see invoked by their own name.
	os.Args = args
	switch name {
	case "etcd":
		etcdmain.Main(args)
		return
	case "kube-apiserver":
		os.Exit(cli.Run(apiserver.NewAPIServerCommand()))
	case "kube-controller-manager":
		os.Exit(cli.Run(controllermanager.NewControllerManagerCommand()))
	case "kube-scheduler":
		os.Exit(cli.Run(scheduler.NewSchedulerCommand()))
	case "kube-proxy":
		os.Exit(cli.Run(proxy.NewProxyCommand()))
	case "kubelet":
		os.Exit(cli.Run(kubelet.NewKubeletCommand(context.Background())))
	case "kubectl":
		if err := cli.RunNoErrOutput(kubectl.NewDefaultKubectlCommand()); err != nil {
			// kubectl has printed the error; keep its exit code convention.
			os.Exit(1)
		}
		os.Exit(0)
	}
	fmt.Fprintf(os.Stderr, "kube: unknown component %q; invoke as one of %v (symlink or first argument)\n", name, components)
	os.Exit(2)
}

func known(name string) bool { return slices.Contains(components, name) }
