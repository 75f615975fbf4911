package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// Retry and backoff intervals of a pod worker.
const (
	retryObject         = 2 * time.Second  // a missing ConfigMap/Secret, an API error
	retryStart          = 5 * time.Second  // a missing executable, a failed start
	initialBackoff      = 10 * time.Second // first restart delay, doubling
	maxBackoff          = 5 * time.Minute
	backoffReset        = 10 * time.Minute // a container that ran this long restarts at once
	initTimeout         = 30 * time.Second // container init handshake and exec
	cgroupRemoveTimeout = 5 * time.Second  // a stopped pod's cgroups let go
	goneGrace           = 2 * time.Second  // pod vanished from the API: short grace
	shutdownGrace       = 5 * time.Second  // agent stopping: cap on every pod's grace
	tokenRefreshPct     = 80               // refresh tokens at this % of their life
)

type ctrState int

const (
	stWaiting ctrState = iota
	stRunning
	stTerminated
)

// ctr is one container of a pod, owned by the pod worker's goroutine.
type ctr struct {
	spec        corev1.Container
	state       ctrState
	waitReason  string
	waitMsg     string
	permanent   bool // a configuration error that no retry fixes
	proc        *process
	startedAt   time.Time
	containerID string
	imageID     string
	ready       bool
	everStarted bool
	restarts    int32
	term        *corev1.ContainerStateTerminated // the last run's end
	backoff     time.Duration
	nextStart   time.Time
	probeStop   context.CancelFunc
	mounts      []mountPlan
}

func (c *ctr) waiting(reason, msg string) {
	c.state, c.waitReason, c.waitMsg = stWaiting, reason, msg
}

// cachedToken is a service-account token of the pod.
type cachedToken struct {
	token     string
	refreshAt time.Time
}

type tokenKey struct {
	audience string
	exp      int64
}

// podWorker runs one pod: a single goroutine (run) owns every field below
// mu's; other goroutines talk to it through update/gone/events.
type podWorker struct {
	a   *Agent
	uid types.UID
	log *slog.Logger

	mu      sync.Mutex
	latest  *corev1.Pod
	deleted bool

	wake   chan struct{}
	events chan func()
	quit   chan struct{}

	pod          *corev1.Pod
	ctrs         []*ctr
	ip           netip.Addr
	netns        string      // the pod's network namespace once made; empty for hostNetwork
	cgroupPod    *corev1.Pod // the pod its cgroups were made for (their path holds its QoS class)
	startTime    metav1.Time
	tokens       map[tokenKey]*cachedToken
	volSynced    time.Time
	conds        map[corev1.PodConditionType]corev1.PodCondition
	lastStatus   *corev1.PodStatus
	killed       bool
	finalDeleted bool
	terminal     corev1.PodPhase
	frozen       bool // the pod ended before this agent saw it: never write its status
	nextWake     time.Time
	done         bool
}

func newPodWorker(a *Agent, pod *corev1.Pod) *podWorker {
	w := &podWorker{
		a:      a,
		uid:    pod.UID,
		latest: pod, // run may sync before podChanged calls update
		log:    a.log.With("pod", pod.Namespace+"/"+pod.Name),
		wake:   make(chan struct{}, 1),
		events: make(chan func(), 16),
		quit:   make(chan struct{}),
		tokens: map[tokenKey]*cachedToken{},
		conds:  map[corev1.PodConditionType]corev1.PodCondition{},
	}
	for _, c := range pod.Spec.Containers {
		w.ctrs = append(w.ctrs, &ctr{spec: c, waitReason: "ContainerCreating"})
	}
	return w
}

func (w *podWorker) update(pod *corev1.Pod) {
	w.mu.Lock()
	w.latest = pod
	w.mu.Unlock()
	w.poke()
}

func (w *podWorker) gone() {
	w.mu.Lock()
	w.deleted = true
	w.mu.Unlock()
	w.poke()
}

func (w *podWorker) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// send runs fn on the worker goroutine (dropped once the worker is done).
func (w *podWorker) send(fn func()) {
	select {
	case w.events <- fn:
	case <-w.quit:
	}
}

// event records a pod event (no-op before the recorder exists).
func (w *podWorker) event(typ, reason, format string, args ...any) {
	if w.a.events != nil && w.pod != nil {
		w.a.events.Eventf(w.pod, typ, reason, format, args...)
	}
}

func (w *podWorker) wakeAt(t time.Time) {
	if w.nextWake.IsZero() || t.Before(w.nextWake) {
		w.nextWake = t
	}
}

func (w *podWorker) run(ctx context.Context) {
	defer close(w.quit)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		w.sync(ctx)
		if w.done {
			return
		}
		wait := time.Hour
		if !w.nextWake.IsZero() {
			wait = max(time.Until(w.nextWake), 0)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			w.killAll(shutdownGrace)
			w.release()
			return
		case <-w.wake:
		case fn := <-w.events:
			fn()
		case <-timer.C:
		}
	}
}

func (w *podWorker) sync(ctx context.Context) {
	w.mu.Lock()
	pod, deleted := w.latest, w.deleted
	w.mu.Unlock()
	w.nextWake = time.Time{}
	now := time.Now()

	if deleted {
		for _, c := range w.ctrs {
			if c.proc != nil {
				w.log.Info("pod gone from the API: stopping it")
				break
			}
		}
		w.killAll(min(deletionGrace(pod), goneGrace))
		w.release()
		w.done = true
		return
	}
	w.pod = pod
	if pod.DeletionTimestamp != nil {
		w.syncDeleting(ctx, pod)
		return
	}
	if w.terminal != "" {
		w.writeStatus(ctx, now) // no-op unless an earlier write failed
		return
	}
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		w.terminal = pod.Status.Phase // finished before this agent started:
		w.frozen = true               // its status is history, not ours to rewrite
		return
	}
	if len(pod.Spec.InitContainers) > 0 {
		for _, c := range w.ctrs {
			c.permanent = true
			c.waiting("CreateContainerConfigError", "init containers are not supported by the skipper node agent")
		}
		w.writeStatus(ctx, now)
		return
	}
	if err := w.ensureIP(pod); err != nil {
		w.log.Warn("pod IP", "err", err)
		for _, c := range w.ctrs {
			if c.state == stWaiting {
				c.waiting("ContainerCreating", "pod IP: "+err.Error())
			}
		}
		w.wakeAt(now.Add(retryStart))
		w.writeStatus(ctx, now)
		return
	}
	if w.startTime.IsZero() {
		w.startTime = metav1.NewTime(now)
		if pod.Status.StartTime != nil {
			w.startTime = *pod.Status.StartTime
		}
	}
	for _, c := range w.ctrs {
		w.syncContainer(ctx, pod, c, now)
	}
	w.syncVolumes(ctx, pod, now)

	if phase, done := w.phase(); done {
		w.terminal = phase
		w.log.Info("pod finished", "phase", phase)
		w.writeStatus(ctx, now)
		w.release()
		return
	}
	w.writeStatus(ctx, now)
}

func deletionGrace(pod *corev1.Pod) time.Duration {
	if pod == nil {
		return 0
	}
	if pod.DeletionGracePeriodSeconds != nil {
		return time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
	}
	if pod.Spec.TerminationGracePeriodSeconds != nil {
		return time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	return 30 * time.Second
}

// syncDeleting stops a pod marked for deletion, then deletes it for good.
func (w *podWorker) syncDeleting(ctx context.Context, pod *corev1.Pod) {
	if !w.killed {
		grace := deletionGrace(pod)
		w.log.Info("pod deleted: stopping containers", "grace", grace)
		for _, c := range w.ctrs {
			if c.proc != nil {
				w.event(corev1.EventTypeNormal, "Killing", "Stopping container %s", c.spec.Name)
			}
		}
		w.killAll(grace)
		w.release()
		w.killed = true
	}
	if w.finalDeleted {
		return
	}
	err := w.a.cs.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: ptr.To(int64(0)),
		Preconditions:      metav1.NewUIDPreconditions(string(pod.UID)),
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		if ctx.Err() == nil {
			w.log.Warn("final pod delete", "err", err)
			w.wakeAt(time.Now().Add(retryObject))
		}
		return
	}
	w.finalDeleted = true
}

// ensureIP gives the pod its IP and, unless it uses the host's network, its
// own network namespace on the node's bridge.
func (w *podWorker) ensureIP(pod *corev1.Pod) error {
	if pod.Spec.HostNetwork {
		w.ip = w.a.cfg.NodeIP
		return nil
	}
	if !w.ip.IsValid() {
		ip, err := w.a.allocateIP(pod.UID, pod.Status.PodIP)
		if err != nil {
			return err
		}
		w.ip = ip
	}
	if w.netns == "" {
		name, err := w.a.net.Add(pod.UID, w.ip)
		if err != nil {
			return fmt.Errorf("pod network: %w", err)
		}
		w.netns = name
		w.log.Info("pod network ready", "netns", name, "ip", w.ip)
	}
	return nil
}

// release removes the pod's cgroups, network namespace and IP once its
// processes are gone. Safe to repeat.
func (w *podWorker) release() {
	if w.cgroupPod != nil {
		if err := w.a.cgroups.RemovePod(w.cgroupPod, cgroupRemoveTimeout); err != nil {
			w.log.Warn("remove pod cgroups", "err", err)
		}
		w.cgroupPod = nil
	}
	if w.netns != "" {
		if err := w.a.net.Del(w.uid); err != nil {
			w.log.Warn("remove pod network", "netns", w.netns, "err", err)
		}
		w.netns = ""
	}
	if w.pod == nil || !w.pod.Spec.HostNetwork {
		w.a.releaseIP(w.uid)
	}
}

func (w *podWorker) facts() podFacts {
	return podFacts{
		PodIP:         w.ip.String(),
		HostIP:        w.a.cfg.NodeIP.String(),
		NodeCPUMilli:  w.a.machine.CPUMilli,
		NodeMemory:    w.a.machine.MemoryBytes,
		APIServerHost: w.a.cfg.APIServerHost,
		APIServerPort: w.a.cfg.APIServerPort,
	}
}

func (w *podWorker) syncContainer(ctx context.Context, pod *corev1.Pod, c *ctr, now time.Time) {
	if c.state == stRunning || c.permanent {
		return
	}
	if c.state == stTerminated || c.nextStart.After(now) {
		if !restartable(pod.Spec.RestartPolicy, c.term) {
			return
		}
		if c.nextStart.IsZero() {
			ran := c.term.FinishedAt.Sub(c.term.StartedAt.Time)
			switch {
			case ran >= backoffReset:
				c.backoff = 0
			case c.backoff == 0:
				c.backoff = initialBackoff
			default:
				c.backoff = min(2*c.backoff, maxBackoff)
			}
			c.nextStart = c.term.FinishedAt.Add(c.backoff)
		}
		if now.Before(c.nextStart) {
			if c.waitReason != "CrashLoopBackOff" {
				w.event(corev1.EventTypeWarning, "BackOff", "Back-off %s restarting failed container %s", c.backoff, c.spec.Name)
			}
			c.waiting("CrashLoopBackOff", fmt.Sprintf("back-off %s restarting failed container %s", c.backoff, c.spec.Name))
			w.wakeAt(c.nextStart)
			return
		}
	}
	w.startContainer(ctx, pod, c, now)
}

func restartable(policy corev1.RestartPolicy, term *corev1.ContainerStateTerminated) bool {
	switch policy {
	case corev1.RestartPolicyNever:
		return false
	case corev1.RestartPolicyOnFailure:
		return term == nil || term.ExitCode != 0
	}
	return true
}

func (w *podWorker) startContainer(ctx context.Context, pod *corev1.Pod, c *ctr, now time.Time) {
	if ctx.Err() != nil {
		return // the agent is stopping
	}
	spec := &c.spec
	path, err := w.a.cfg.Images.Resolve(spec.Image, spec.Command, spec.Args)
	if err != nil {
		c.permanent = true
		c.waiting("ErrImageNeverPull", err.Error())
		w.log.Warn("container image", "container", spec.Name, "err", err)
		w.event(corev1.EventTypeWarning, "ErrImageNeverPull", "Container %s: %v", spec.Name, err)
		return
	}
	if st, err := os.Stat(path); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		c.waiting("ErrImageNeverPull", fmt.Sprintf("image %s: executable %s not found (build it into the mapped directory)", spec.Image, path))
		w.wakeAt(now.Add(retryStart))
		return
	}
	c.imageID = "skipper://" + path
	mounts, err := PlanMounts(pod, spec)
	if err != nil {
		c.permanent = true
		c.waiting("CreateContainerConfigError", err.Error())
		w.log.Warn("container mounts", "container", spec.Name, "err", err)
		w.event(corev1.EventTypeWarning, "Failed", "Container %s: %v", spec.Name, err)
		return
	}
	c.mounts = mounts
	env, argv, err := ContainerEnv(ctx, w.a, pod, spec, w.facts())
	if err != nil {
		if c.waitMsg != err.Error() {
			w.event(corev1.EventTypeWarning, "Failed", "Container %s: %v", spec.Name, err)
		}
		c.waiting("CreateContainerConfigError", err.Error())
		w.wakeAt(now.Add(retryObject))
		return
	}
	if len(argv) == 0 {
		c.permanent = true
		c.waiting("CreateContainerConfigError", "container has neither command nor args")
		return
	}
	vols, err := w.volumeContents(ctx, pod, mounts)
	if err != nil {
		if c.waitMsg != err.Error() {
			w.event(corev1.EventTypeWarning, "FailedMount", "Container %s: %v", spec.Name, err)
		}
		c.waiting("ContainerCreating", err.Error())
		w.wakeAt(now.Add(retryObject))
		return
	}
	if w.cgroupPod == nil {
		w.cgroupPod = pod // the QoS class in the path never changes
	}
	cgroups, err := w.a.cgroups.EnsureContainer(w.cgroupPod, spec.Name)
	if err != nil {
		c.waiting("RunContainerError", err.Error())
		w.log.Warn("container cgroup", "container", spec.Name, "err", err)
		w.wakeAt(now.Add(retryStart))
		return
	}
	logPath := filepath.Join(w.a.cfg.PodLogDir, fmt.Sprintf("%s_%s_%s.log", pod.Namespace, pod.Name, spec.Name))
	dir := spec.WorkingDir
	if dir == "" {
		dir = "/"
	}
	proc, err := startContainer(w.a.init, startSpec{
		Exec:        execSpec{Path: path, Argv: argv, Env: env, Dir: dir},
		LogPath:     logPath,
		InitTimeout: initTimeout,
		Netns:       w.netns,
		Cgroups:     cgroups,
		Prepare: func(_ int, root string) error {
			return writeVolumes(root, mounts, vols)
		},
	})
	if err != nil {
		c.waiting("RunContainerError", err.Error())
		w.log.Warn("start container", "container", spec.Name, "err", err)
		w.event(corev1.EventTypeWarning, "Failed", "Error: %v", err)
		w.wakeAt(now.Add(retryStart))
		return
	}
	if c.everStarted {
		c.restarts++
	}
	c.everStarted = true
	c.state, c.proc, c.startedAt = stRunning, proc, now
	c.containerID = "skipper://" + strconv.Itoa(proc.pid)
	c.nextStart = time.Time{}
	c.ready = false
	w.event(corev1.EventTypeNormal, "Started", "Started container %s (pid %d, %s)", spec.Name, proc.pid, path)
	w.log.Info("container started", "container", spec.Name, "pid", proc.pid, "ip", w.ip, "netns", w.netns, "exe", path, "log", logPath)

	go func() {
		<-proc.exited
		w.send(func() { w.containerExited(c, proc) })
	}()
	if spec.ReadinessProbe != nil {
		pctx, cancel := context.WithCancel(ctx)
		c.probeStop = cancel
		pr := newProber(spec.ReadinessProbe, w.ip.String(), spec.Ports)
		go pr.run(pctx, func(ok bool) {
			w.send(func() {
				if c.proc == proc && c.ready != ok {
					c.ready = ok
					w.log.Info("readiness changed", "container", spec.Name, "ready", ok)
				}
			})
		})
	} else {
		c.ready = true
	}
	if spec.LivenessProbe != nil {
		pctx, cancel := context.WithCancel(ctx)
		prev := c.probeStop
		c.probeStop = func() {
			cancel()
			if prev != nil {
				prev()
			}
		}
		grace := deletionGrace(&corev1.Pod{Spec: pod.Spec})
		if s := spec.LivenessProbe.TerminationGracePeriodSeconds; s != nil {
			grace = time.Duration(*s) * time.Second
		}
		pr := newLivenessProber(spec.LivenessProbe, w.ip.String(), spec.Ports)
		go pr.run(pctx, func(bool) {
			w.send(func() {
				if c.proc == proc {
					w.log.Warn("liveness probe failed: restarting container", "container", spec.Name)
					w.event(corev1.EventTypeWarning, "Unhealthy", "Liveness probe failed: container %s will be restarted", spec.Name)
					go proc.stop(grace)
				}
			})
		})
	}
}

func (w *podWorker) containerExited(c *ctr, proc *process) {
	if c.proc != proc {
		return
	}
	w.recordExit(c, proc.code, time.Now())
	w.log.Info("container exited", "container", c.spec.Name, "code", proc.code, "pid", proc.pid)
	proc.signal(syscall.SIGKILL) // whatever it left in its process group
}

func (w *podWorker) recordExit(c *ctr, code int, now time.Time) {
	if c.probeStop != nil {
		c.probeStop()
		c.probeStop = nil
	}
	reason := "Completed"
	if code != 0 {
		reason = "Error"
	}
	c.term = &corev1.ContainerStateTerminated{
		ExitCode: int32(code), Reason: reason, StartedAt: metav1.NewTime(c.startedAt),
		FinishedAt: metav1.NewTime(now), ContainerID: c.containerID,
	}
	c.state, c.proc, c.ready = stTerminated, nil, false
}

// killAll stops every running container with the given grace, in parallel.
func (w *podWorker) killAll(grace time.Duration) {
	var wg sync.WaitGroup
	for _, c := range w.ctrs {
		if c.proc == nil {
			continue
		}
		if c.probeStop != nil {
			c.probeStop()
			c.probeStop = nil
		}
		proc := c.proc
		wg.Go(func() { proc.stop(grace) })
	}
	wg.Wait()
	for _, c := range w.ctrs {
		if c.proc != nil {
			code := c.proc.code
			select {
			case <-c.proc.exited:
			default:
				code = 137
			}
			w.recordExit(c, code, time.Now())
		}
	}
}

// volumeContents computes the files of every files volume of mounts.
func (w *podWorker) volumeContents(ctx context.Context, pod *corev1.Pod, mounts []mountPlan) (map[string]map[string][]byte, error) {
	out := map[string]map[string][]byte{}
	for _, m := range mounts {
		if m.Kind != volFiles {
			continue
		}
		if _, ok := out[m.Volume.Name]; ok {
			continue
		}
		files, err := volumeFiles(ctx, w.a, w, pod, m.Volume, w.facts())
		if err != nil {
			return nil, fmt.Errorf("volume %s: %w", m.Volume.Name, err)
		}
		out[m.Volume.Name] = files
	}
	return out, nil
}

func writeVolumes(root string, mounts []mountPlan, vols map[string]map[string][]byte) error {
	for _, m := range mounts {
		switch m.Kind {
		case volEmptyDir:
			if err := os.MkdirAll(filepath.Join(root, m.Target), 0o777); err != nil {
				return fmt.Errorf("emptyDir %s: %w", m.Name, err)
			}
		case volFiles:
			if err := writeVolume(root, m.Target, vols[m.Volume.Name]); err != nil {
				return fmt.Errorf("volume %s: %w", m.Name, err)
			}
		}
	}
	return nil
}

// Token implements tokenSource with a per-pod cache; tokens are refreshed
// once they have lived tokenRefreshPct of their lifetime.
func (w *podWorker) Token(ctx context.Context, pod *corev1.Pod, audience string, exp int64) (string, error) {
	k := tokenKey{audience, exp}
	now := time.Now()
	if t, ok := w.tokens[k]; ok && now.Before(t.refreshAt) {
		return t.token, nil
	}
	tok, expires, err := w.a.requestToken(ctx, pod, audience, exp)
	if err != nil {
		return "", err
	}
	life := expires.Sub(now)
	// --service-account-extend-token-expiration hands out longer tokens
	// than asked for; refresh by the requested lifetime as the kubelet does.
	if asked := time.Duration(exp) * time.Second; life > asked {
		life = asked
	}
	w.tokens[k] = &cachedToken{token: tok, refreshAt: now.Add(life * tokenRefreshPct / 100)}
	return tok, nil
}

var _ tokenSource = (*podWorker)(nil)

// syncVolumes rewrites the volumes of running containers every VolumeResync
// and whenever a token is due for refresh.
func (w *podWorker) syncVolumes(ctx context.Context, pod *corev1.Pod, now time.Time) {
	due := w.volSynced.IsZero() || now.Sub(w.volSynced) >= w.a.cfg.VolumeResync
	for _, t := range w.tokens {
		if !now.Before(t.refreshAt) {
			due = true
		}
		w.wakeAt(t.refreshAt)
	}
	if w.volSynced.IsZero() {
		w.volSynced = now // containers were just started with fresh volumes
		due = false
	}
	w.wakeAt(w.volSynced.Add(w.a.cfg.VolumeResync))
	if !due {
		return
	}
	w.volSynced = now
	for _, c := range w.ctrs {
		if c.proc == nil {
			continue
		}
		vols, err := w.volumeContents(ctx, pod, c.mounts)
		if err != nil {
			w.log.Warn("refresh volumes", "container", c.spec.Name, "err", err)
			w.wakeAt(now.Add(retryObject))
			continue
		}
		root := fmt.Sprintf("/proc/%d/root", c.proc.pid)
		if err := writeVolumes(root, c.mounts, vols); err != nil && !errors.Is(err, os.ErrNotExist) {
			w.log.Warn("refresh volumes", "container", c.spec.Name, "err", err)
		}
	}
}
