package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"

	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/manager"
	daemon "github.com/containerd/containerd/v2/cmd/containerd/command"
	ctr "github.com/containerd/containerd/v2/cmd/ctr/app"
	"github.com/containerd/containerd/v2/pkg/shim"

	// The daemon's plugins: cmd/containerd/builtins (builtins.go,
	// builtins_linux.go, cri.go, tracing.go) of v2.4.2, less btrfs (cgo),
	// devmapper and zfs. Compare with that package when bumping the version.
	_ "github.com/containerd/containerd/api/types/runc/options"
	_ "github.com/containerd/containerd/v2/core/metrics/cgroups"
	_ "github.com/containerd/containerd/v2/core/metrics/cgroups/v2"
	_ "github.com/containerd/containerd/v2/core/runtime/v2"
	_ "github.com/containerd/containerd/v2/pkg/tracing/plugin"
	_ "github.com/containerd/containerd/v2/plugins/content/local/plugin"
	_ "github.com/containerd/containerd/v2/plugins/cri"
	_ "github.com/containerd/containerd/v2/plugins/cri/images"
	_ "github.com/containerd/containerd/v2/plugins/cri/runtime"
	_ "github.com/containerd/containerd/v2/plugins/diff/erofs/plugin"
	_ "github.com/containerd/containerd/v2/plugins/diff/walking/plugin"
	_ "github.com/containerd/containerd/v2/plugins/events"
	_ "github.com/containerd/containerd/v2/plugins/gc"
	_ "github.com/containerd/containerd/v2/plugins/imageverifier"
	_ "github.com/containerd/containerd/v2/plugins/leases"
	_ "github.com/containerd/containerd/v2/plugins/metadata"
	_ "github.com/containerd/containerd/v2/plugins/mount"
	_ "github.com/containerd/containerd/v2/plugins/mount/erofs"
	_ "github.com/containerd/containerd/v2/plugins/mount/fsview/erofs"
	_ "github.com/containerd/containerd/v2/plugins/nri"
	_ "github.com/containerd/containerd/v2/plugins/restart"
	_ "github.com/containerd/containerd/v2/plugins/sandbox"
	_ "github.com/containerd/containerd/v2/plugins/server/debug"
	_ "github.com/containerd/containerd/v2/plugins/server/grpc"
	_ "github.com/containerd/containerd/v2/plugins/server/metrics"
	_ "github.com/containerd/containerd/v2/plugins/server/ttrpc"
	_ "github.com/containerd/containerd/v2/plugins/services/containers"
	_ "github.com/containerd/containerd/v2/plugins/services/content"
	_ "github.com/containerd/containerd/v2/plugins/services/diff"
	_ "github.com/containerd/containerd/v2/plugins/services/events"
	_ "github.com/containerd/containerd/v2/plugins/services/healthcheck"
	_ "github.com/containerd/containerd/v2/plugins/services/images"
	_ "github.com/containerd/containerd/v2/plugins/services/introspection"
	_ "github.com/containerd/containerd/v2/plugins/services/leases"
	_ "github.com/containerd/containerd/v2/plugins/services/mounts"
	_ "github.com/containerd/containerd/v2/plugins/services/namespaces"
	_ "github.com/containerd/containerd/v2/plugins/services/opt"
	_ "github.com/containerd/containerd/v2/plugins/services/sandbox"
	_ "github.com/containerd/containerd/v2/plugins/services/snapshots"
	_ "github.com/containerd/containerd/v2/plugins/services/streaming"
	_ "github.com/containerd/containerd/v2/plugins/services/tasks"
	_ "github.com/containerd/containerd/v2/plugins/services/transfer"
	_ "github.com/containerd/containerd/v2/plugins/services/version"
	_ "github.com/containerd/containerd/v2/plugins/services/warning"
	_ "github.com/containerd/containerd/v2/plugins/snapshots/blockfile/plugin"
	_ "github.com/containerd/containerd/v2/plugins/snapshots/erofs/plugin"
	_ "github.com/containerd/containerd/v2/plugins/snapshots/native/plugin"
	_ "github.com/containerd/containerd/v2/plugins/snapshots/overlay/plugin"
	_ "github.com/containerd/containerd/v2/plugins/streaming"
	_ "github.com/containerd/containerd/v2/plugins/transfer"

	// The shim's only plugin (cmd/containerd-shim-runc-v2/main.go).
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/task/plugin"
)

// shimTask is the URI of the runc shim's task service, the one plugin the
// shim registers at init. Every other registration belongs to the daemon.
const shimTask = "io.containerd.ttrpc.v1.task"

var components = []string{"containerd", "containerd-shim-runc-v2", "ctr"}

func main() {
	name := filepath.Base(os.Args[0])
	args := os.Args
	// The binary is itself named containerd, so a component named by the
	// first argument wins: none of the three takes a component's name as
	// its first argument.
	if len(os.Args) > 1 && known(os.Args[1]) {
		name, args = os.Args[1], os.Args[1:]
	}
	ctx := context.Background()
	switch name {
	case "containerd":
		keepPlugins(func(r *plugin.Registration) bool { return r.URI() != shimTask })
		if err := daemon.App().Run(ctx, args); err != nil {
			fmt.Fprintln(os.Stderr, "containerd:", err)
			os.Exit(1)
		}
		return
	case "containerd-shim-runc-v2":
		keepPlugins(func(r *plugin.Registration) bool { return r.URI() == shimTask })
		os.Args = args
		shim.RunShim(ctx, manager.NewShimManager("io.containerd.runc.v2"))
		return
	case "ctr":
		if err := ctr.New().Run(ctx, args); err != nil {
			fmt.Fprintln(os.Stderr, "ctr:", err)
			os.Exit(1)
		}
		return
	}
	fmt.Fprintf(os.Stderr, "containerd: unknown component %q; invoke as one of %v (link name or first argument)\n", name, components)
	os.Exit(2)
}

// keepPlugins drops from containerd's global plugin registry every
// registration keep rejects. The daemon and the shim each initialise every
// plugin registered in the process; linked into one binary, each would
// otherwise start the other's (the shim would open the daemon's metadata and
// CRI with no configuration, the daemon would serve the shim's task API).
func keepPlugins(keep func(*plugin.Registration) bool) {
	all := registry.Graph(nil)
	registry.Reset()
	for i := range all {
		if keep(&all[i]) {
			registry.Register(&all[i])
		}
	}
}

func known(name string) bool {
	for _, c := range components {
		if c == name {
			return true
		}
	}
	return false
}
