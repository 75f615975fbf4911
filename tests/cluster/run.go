package cluster

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
)

// Run is the command line of bin/skipper-cluster: `up`, `down` or `--help`.
func Run(ctx context.Context, args []string, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usageHead)
		return errors.New("want a command: up or down")
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	switch cmd := args[0]; cmd {
	case "up", "down":
		cfg, err := parseFlags(cmd, args[1:], stderr)
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
	case "-h", "-help", "--help", "help":
		_, err := parseFlags("up", []string{"--help"}, stderr)
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	default:
		fmt.Fprint(stderr, usageHead)
		return fmt.Errorf("unknown command %q: want up or down", cmd)
	}
}
