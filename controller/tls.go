package controller

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/credentials"

	"skipper.dev/skipper/proto/skipperv1/tlsfiles"
)

// tlsRecheck is how often, at most, --tls-dir is read again at a
// handshake: a rotated certificate is served within a second of the
// kubelet's update of the Secret volume (itself up to a minute or so
// after cert-manager's update of the Secret).
const tlsRecheck = time.Second

// Results of skipper_controller_tls_reloads_total.
const (
	tlsReloadOK    = "ok"
	tlsReloadError = "error"
)

// grpcTLS is TLS on the gRPC port and on forwards to other replicas; nil
// members when --tls-dir is empty (plaintext).
type grpcTLS struct {
	server credentials.TransportCredentials
	client credentials.TransportCredentials
}

// loadTLS loads --tls-dir (every file required, and the certificate must
// carry the name forwards verify, or no replica could forward to this
// one) and counts its reloads on reg, whose series exist, at zero, with
// TLS off too.
func loadTLS(cfg Config, log *slog.Logger, reg prometheus.Registerer) (grpcTLS, error) {
	reloads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "skipper_controller_tls_reloads_total",
		Help: "Reads of changed files in --tls-dir, by result: ok (the new certificate and CA are used from the next handshake) or error (the files do not parse; the last good ones are kept).",
	}, []string{"result"})
	reloads.WithLabelValues(tlsReloadOK)
	reloads.WithLabelValues(tlsReloadError)
	reg.MustRegister(reloads)
	if cfg.TLSDir == "" {
		return grpcTLS{}, nil
	}
	name := cfg.tlsServerName()
	f, err := tlsfiles.Load(cfg.TLSDir, tlsfiles.Options{Cert: true, CA: true, Recheck: tlsRecheck,
		Reloaded: func(err error) {
			if err != nil {
				reloads.WithLabelValues(tlsReloadError).Inc()
				log.Error("TLS files changed but cannot be used; serving the last good ones", "dir", cfg.TLSDir, "err", err)
				return
			}
			reloads.WithLabelValues(tlsReloadOK).Inc()
			log.Info("TLS files reloaded", "dir", cfg.TLSDir)
		}})
	if err != nil {
		return grpcTLS{}, fmt.Errorf("--tls-dir: %w", err)
	}
	leaf := f.Leaf()
	if err := leaf.VerifyHostname(name); err != nil {
		return grpcTLS{}, fmt.Errorf("--tls-dir: %s must name the controllers as --tls-server-name says (replicas verify each other by it): %w", tlsfiles.CertFile, err)
	}
	log.Info("gRPC over TLS", "dir", cfg.TLSDir, "server_name", name, "serial", leaf.SerialNumber.String(), "not_after", leaf.NotAfter)
	return grpcTLS{server: f.ServerCredentials(), client: f.ClientCredentials(name)}, nil
}

// tlsServerName is the name every replica's certificate carries and
// forwards verify: --tls-server-name, or the controller Service's
// <service>.<namespace>.svc (never resolved: replicas are dialled by pod
// IP).
func (c Config) tlsServerName() string {
	if c.TLSServerName != "" {
		return c.TLSServerName
	}
	return c.ControllerService + "." + c.PodNamespace + ".svc"
}
