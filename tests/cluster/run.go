package cluster

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// Run is the command line of bin/skipper-cluster: `up`, `down` or `--help`;
// getenv looks up the flags' environment fallbacks (package os's LookupEnv,
// from main).
func Run(ctx context.Context, args []string, getenv func(string) (string, bool), stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usageHead)
		return errors.New("want a command: up or down")
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	switch cmd := args[0]; cmd {
	case "stop", "start":
		if len(args) < 2 || strings.HasPrefix(args[1], "-") {
			return fmt.Errorf("%s needs a component: one of %s", cmd, strings.Join(restartable, ", "))
		}
		cfg, err := parseFlags(cmd, args[2:], getenv, stderr)
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(ctx, cfg.StartTimeout+cfg.StopTimeout)
		defer cancel()
		if err := Control(ctx, cfg.State.Dir, cmd, args[1]); err != nil {
			return err
		}
		log.Info("done", "command", cmd, "component", args[1])
		return nil
	case "up", "down":
		cfg, err := parseFlags(cmd, args[1:], getenv, stderr)
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		if err != nil {
			return err
		}
		if cmd == "down" {
			return Down(cfg, log)
		}
		return Up(ctx, cfg, log)
	case "node":
		// Internal: the process that is one node (Up starts it).
		if len(args) != 3 || args[1] != "--spec" {
			return errors.New("usage: skipper-cluster node --spec FILE (started by 'up', not by hand)")
		}
		return RunNode(ctx, args[2], log)
	case "-h", "-help", "--help", "help":
		_, err := parseFlags("up", []string{"--help"}, getenv, stderr)
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	default:
		fmt.Fprint(stderr, usageHead)
		return fmt.Errorf("unknown command %q: want up, down, stop or start", cmd)
	}
}
