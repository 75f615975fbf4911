package nodeagent

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// phase returns the pod's phase from its containers, and whether it is
// final (every container ended and none will restart).
func (w *podWorker) phase() (corev1.PodPhase, bool) {
	running, ended, failed, restarting := 0, 0, 0, 0
	for _, c := range w.ctrs {
		switch {
		case c.state == stRunning:
			running++
		case c.state == stTerminated && !restartable(w.pod.Spec.RestartPolicy, c.term):
			ended++
			if c.term.ExitCode != 0 {
				failed++
			}
		case c.everStarted:
			restarting++
		}
	}
	switch {
	case len(w.ctrs) > 0 && ended == len(w.ctrs) && failed == 0:
		return corev1.PodSucceeded, true
	case len(w.ctrs) > 0 && ended == len(w.ctrs):
		return corev1.PodFailed, true
	case running > 0 || restarting > 0 || ended > 0:
		return corev1.PodRunning, false
	}
	return corev1.PodPending, false
}

// buildStatus is the pod status the agent owns, on top of base (the status
// fields others own: PodScheduled and foreign conditions, QOS class).
func (w *podWorker) buildStatus(base corev1.PodStatus, now time.Time) corev1.PodStatus {
	st := *base.DeepCopy()
	phase, _ := w.phase()
	if w.terminal != "" {
		phase = w.terminal
	}
	st.Phase = phase
	st.Reason, st.Message = "", ""
	st.HostIP = w.a.cfg.NodeIP.String()
	st.HostIPs = []corev1.HostIP{{IP: st.HostIP}}
	if w.ip.IsValid() {
		st.PodIP = w.ip.String()
		st.PodIPs = []corev1.PodIP{{IP: st.PodIP}}
	}
	if !w.startTime.IsZero() {
		st.StartTime = ptr.To(w.startTime)
	}

	allReady := len(w.ctrs) > 0
	var unready []string
	st.ContainerStatuses = nil
	for _, c := range w.ctrs {
		cs := corev1.ContainerStatus{
			Name:         c.spec.Name,
			Image:        c.spec.Image,
			ImageID:      c.imageID,
			ContainerID:  c.containerID,
			RestartCount: c.restarts,
			Ready:        c.ready && c.state == stRunning,
			Started:      ptr.To(c.state == stRunning),
		}
		switch c.state {
		case stRunning:
			cs.State.Running = &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(c.startedAt)}
			if c.restarts > 0 && c.term != nil {
				cs.LastTerminationState.Terminated = c.term.DeepCopy()
			}
		case stTerminated:
			cs.State.Terminated = c.term.DeepCopy()
		default:
			cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: c.waitReason, Message: c.waitMsg}
			if c.term != nil {
				cs.LastTerminationState.Terminated = c.term.DeepCopy()
			}
		}
		if !cs.Ready {
			allReady = false
			unready = append(unready, c.spec.Name)
		}
		st.ContainerStatuses = append(st.ContainerStatuses, cs)
	}
	if phase != corev1.PodRunning {
		allReady = false
	}

	ready, readyReason, readyMsg := corev1.ConditionTrue, "", ""
	if !allReady {
		ready = corev1.ConditionFalse
		readyReason = "ContainersNotReady"
		if w.terminal != "" {
			readyReason = "PodCompleted"
		}
		readyMsg = fmt.Sprintf("containers with unready status: [%s]", strings.Join(unready, " "))
	}
	started := corev1.ConditionFalse
	if w.ip.IsValid() {
		started = corev1.ConditionTrue
	}
	w.setCond(corev1.PodReadyToStartContainers, started, "", "", now)
	w.setCond(corev1.PodInitialized, corev1.ConditionTrue, "", "", now)
	w.setCond(corev1.ContainersReady, ready, readyReason, readyMsg, now)
	w.setCond(corev1.PodReady, ready, readyReason, readyMsg, now)

	var conds []corev1.PodCondition
	for _, c := range base.Conditions {
		if _, ours := w.conds[c.Type]; !ours {
			conds = append(conds, c)
		}
	}
	for _, t := range []corev1.PodConditionType{corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		conds = append(conds, w.conds[t])
	}
	slices.SortStableFunc(conds, func(a, b corev1.PodCondition) int { return condOrder(a.Type) - condOrder(b.Type) })
	st.Conditions = conds
	return st
}

func condOrder(t corev1.PodConditionType) int {
	switch t {
	case corev1.PodReadyToStartContainers:
		return 0
	case corev1.PodInitialized:
		return 1
	case corev1.PodReady:
		return 2
	case corev1.ContainersReady:
		return 3
	case corev1.PodScheduled:
		return 4
	}
	return 5
}

// setCond records a condition, keeping its transition time while its
// status holds.
func (w *podWorker) setCond(t corev1.PodConditionType, s corev1.ConditionStatus, reason, msg string, now time.Time) {
	old, ok := w.conds[t]
	c := corev1.PodCondition{Type: t, Status: s, Reason: reason, Message: msg, LastTransitionTime: metav1.NewTime(now.Truncate(time.Second))}
	if ok && old.Status == s {
		c.LastTransitionTime = old.LastTransitionTime
	}
	w.conds[t] = c
}

// writeStatus writes the pod's status through /status when it changed.
func (w *podWorker) writeStatus(ctx context.Context, now time.Time) {
	if w.frozen {
		return
	}
	st := w.buildStatus(w.pod.Status, now)
	if w.lastStatus != nil && equality.Semantic.DeepEqual(*w.lastStatus, st) {
		return
	}
	pod := w.pod.DeepCopy()
	pod.Status = st
	pods := w.a.cs.CoreV1().Pods(pod.Namespace)
	_, err := pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		fresh, gerr := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if gerr != nil {
			err = gerr
		} else if fresh.UID != w.uid {
			return
		} else {
			fresh.Status = w.buildStatus(fresh.Status, now)
			st = fresh.Status
			_, err = pods.UpdateStatus(ctx, fresh, metav1.UpdateOptions{})
		}
	}
	if err != nil {
		if apierrors.IsNotFound(err) || ctx.Err() != nil {
			return
		}
		w.log.Warn("update pod status", "err", err)
		w.wakeAt(now.Add(retryObject))
		return
	}
	w.lastStatus = &st
}
