package noderouter

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"skipper.dev/skipper/proto/skipperv1/tlsfiles"
)

// tlsRecheck is how often, at most, --controller-tls-dir is read again at
// a handshake with a controller.
const tlsRecheck = time.Second

// Results of skipper_noderouter_tls_reloads_total.
const (
	tlsReloadOK    = "ok"
	tlsReloadError = "error"
)

// loadControllerTLS makes the control plane dial controllers over TLS,
// verified against ca.crt in --controller-tls-dir and the controllers'
// name, when that flag is set; it fails when the directory cannot be
// used. Reloads are counted with TLS off too (at zero). Call it before
// run, once.
func (rt *router) loadControllerTLS() error {
	reloads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "skipper_noderouter_tls_reloads_total",
		Help: "Reads of a changed ca.crt in --controller-tls-dir, by result: ok (used from the next connection to a controller) or error (it does not parse; the last good one is kept).",
	}, []string{"result"})
	reloads.WithLabelValues(tlsReloadOK)
	reloads.WithLabelValues(tlsReloadError)
	prometheus.WrapRegistererWith(prometheus.Labels{"node": rt.cfg.NodeName}, rt.m.reg).MustRegister(reloads)
	dir := rt.cfg.ControllerTLSDir
	if dir == "" {
		return nil
	}
	f, err := tlsfiles.Load(dir, tlsfiles.Options{CA: true, Recheck: tlsRecheck,
		Reloaded: func(err error) {
			if err != nil {
				reloads.WithLabelValues(tlsReloadError).Inc()
				rt.log.Error("controller CA changed but cannot be used; verifying with the last good one", "dir", dir, "err", err)
				return
			}
			reloads.WithLabelValues(tlsReloadOK).Inc()
			rt.log.Info("controller CA reloaded", "dir", dir)
		}})
	if err != nil {
		return fmt.Errorf("--controller-tls-dir: %w", err)
	}
	name := rt.cfg.controllerServerName()
	rt.cp.transport = f.ClientCredentials(name)
	rt.log.Info("controllers dialled over TLS", "dir", dir, "server_name", name)
	return nil
}

// controllerServerName is the name controllers' certificates carry:
// --controller-tls-server-name, or the controller Service's
// <service>.<namespace>.svc (never resolved: controllers are dialled by
// pod IP).
func (c Config) controllerServerName() string {
	if c.ControllerTLSServerName != "" {
		return c.ControllerTLSServerName
	}
	return c.ControllerService + "." + c.ControllerNamespace + ".svc"
}
