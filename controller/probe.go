package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"skipper.dev/skipper/controller/api/v1alpha1"
	"skipper.dev/skipper/controller/assign"
)

// Adoption from the routers' reports (issue 15 item 3): a router reports
// the instances it routes to, and one the owner finds still in the pool
// (no record) may be a claim whose controller died between the assign and
// the record. The owner asks its instance what it holds, read-only, and
// adopts it for that function (adopt writes the record). A report alone
// changes nothing: only the instance's own answer does.

// probeRest is how long a pod whose instance answered is not asked again.
const probeRest = 30 * time.Second

// probe asks the instances of fn's pool pods uids (reported as fn's by
// routers) what they hold, in the background, and adopts each that holds a
// function.
func (c *controller) probe(fn *v1alpha1.Function, port int32, uids []types.UID) {
	pool := c.cache.poolPods(fn.Namespace, fn.Spec.Pool)
	now := time.Now()
	for _, uid := range uids {
		var pod *corev1.Pod
		for _, p := range pool {
			if p.UID == uid {
				pod = p
			}
		}
		if pod == nil || pod.Labels[v1alpha1.LabelFunction] != "" || pod.Status.PodIP == "" || pod.DeletionTimestamp != nil {
			continue // gone, recorded since, or not a pod of fn's pool
		}
		if !c.probing.start(uid, now) {
			continue
		}
		c.wg.Go(func() {
			defer func() { c.probing.done(uid, time.Now().Add(probeRest)) }()
			ctx, cancel := context.WithTimeout(c.runCtx, c.cfg.AssignTimeout)
			defer cancel()
			held, err := c.askInstance(ctx, pod, port)
			switch {
			case err != nil:
				c.log.Debug("could not ask a reported pool pod what it holds", "function", fn.Key(), "pod", pod.Name, "err", err)
			case held == "":
				c.log.Debug("routers report a pool pod whose instance holds nothing", "function", fn.Key(), "pod", pod.Name)
			default:
				c.log.Info("routers report a pool pod whose instance holds a function", "pod", pod.Namespace+"/"+pod.Name,
					"holds", held, "reported_for", fn.Key())
				c.adopt(pod, held)
			}
		})
	}
}

// askInstance returns the function pod's instance holds ("" for none):
// GET on the assign endpoint.
func (c *controller) askInstance(ctx context.Context, pod *corev1.Pod, port int32) (string, error) {
	// The pod's UID goes along: an instance that is another pod (the IP
	// was reused) says so rather than answer for it.
	url := "http://" + net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(int(v1alpha1.AssignPort(pod, port)))) + assign.Path + "?pod=" + string(pod.UID)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return "", fmt.Errorf("GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusNotFound && !assign.IsOtherPod(body) {
		// The pod's own answer (not another's at a reused IP): the token
		// formats it verifies.
		c.preconn.answered(pod.UID, resp.Header.Get(assign.HeaderTokenFormats))
	}
	switch resp.StatusCode {
	case http.StatusOK:
		var a assign.Assignment
		if err := json.Unmarshal(body, &a); err != nil {
			return "", fmt.Errorf("GET %s: %w", url, err)
		}
		return a.Function, nil
	case http.StatusNotFound:
		return "", nil
	default:
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
}
