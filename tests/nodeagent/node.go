package nodeagent

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

const nodeLeaseNamespace = "kube-node-lease"

// machine describes the host's resources.
type machine struct {
	CPUMilli      int64
	MemoryBytes   int64
	KernelVersion string
	MachineID     string
}

func readMachine() machine {
	m := machine{CPUMilli: int64(runtime.NumCPU()) * 1000}
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) >= 2 && fields[0] == "MemTotal:" {
				if kb, err := strconv.ParseInt(fields[1], 10, 64); err == nil {
					m.MemoryBytes = kb * 1024
				}
			}
		}
		f.Close()
	}
	if data, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.KernelVersion = strings.TrimSpace(string(data))
	}
	if data, err := os.ReadFile("/etc/machine-id"); err == nil {
		m.MachineID = strings.TrimSpace(string(data))
	}
	return m
}

// nodeObject is the Node the agent registers.
func (a *Agent) nodeObject() *corev1.Node {
	cidr := a.cfg.PodCIDR.String()
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: a.cfg.NodeName,
			Labels: map[string]string{
				corev1.LabelHostname:   a.cfg.NodeName,
				corev1.LabelOSStable:   runtime.GOOS,
				corev1.LabelArchStable: runtime.GOARCH,
				"skipper.dev/node":     "local",
			},
		},
		Spec: corev1.NodeSpec{PodCIDR: cidr, PodCIDRs: []string{cidr}},
	}
}

// nodeStatus is the status the agent reports, heartbeat at now.
func (a *Agent) nodeStatus(now time.Time) corev1.NodeStatus {
	res := corev1.ResourceList{
		corev1.ResourceCPU:              *resource.NewMilliQuantity(a.machine.CPUMilli, resource.DecimalSI),
		corev1.ResourceMemory:           *resource.NewQuantity(a.machine.MemoryBytes, resource.BinarySI),
		corev1.ResourcePods:             *resource.NewQuantity(int64(a.cfg.MaxPods), resource.DecimalSI),
		corev1.ResourceEphemeralStorage: resource.MustParse("10Gi"),
	}
	hb := metav1.NewTime(now)
	since := metav1.NewTime(a.started)
	cond := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg, LastHeartbeatTime: hb, LastTransitionTime: since}
	}
	return corev1.NodeStatus{
		Capacity:    res,
		Allocatable: res.DeepCopy(),
		Phase:       corev1.NodeRunning,
		Conditions: []corev1.NodeCondition{
			cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "skipper node agent does not track memory pressure"),
			cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "skipper node agent does not track disk pressure"),
			cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "skipper node agent does not track PID pressure"),
			cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "skipper node agent is posting ready status"),
		},
		Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: a.cfg.NodeIP.String()},
			{Type: corev1.NodeHostName, Address: a.cfg.NodeName},
		},
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: 0}},
		NodeInfo: corev1.NodeSystemInfo{
			MachineID:               a.machine.MachineID,
			SystemUUID:              a.machine.MachineID,
			BootID:                  a.machine.MachineID,
			KernelVersion:           a.machine.KernelVersion,
			OSImage:                 "skipper local node",
			ContainerRuntimeVersion: "skipper://0.1.0",
			KubeletVersion:          a.cfg.KubeletVersion,
			OperatingSystem:         runtime.GOOS,
			Architecture:            runtime.GOARCH,
		},
	}
}

// registerNode creates the Node (or adopts an existing one) and writes its
// status, retrying until it succeeds or ctx ends.
func (a *Agent) registerNode(ctx context.Context) error {
	backoff := 500 * time.Millisecond
	for {
		err := a.tryRegister(ctx)
		if err == nil {
			return nil
		}
		a.log.Warn("register node", "node", a.cfg.NodeName, "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return fmt.Errorf("register node %s: %w", a.cfg.NodeName, err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

func (a *Agent) tryRegister(ctx context.Context) error {
	nodes := a.cs.CoreV1().Nodes()
	node, err := nodes.Create(ctx, a.nodeObject(), metav1.CreateOptions{})
	switch {
	case apierrors.IsAlreadyExists(err):
		node, err = nodes.Get(ctx, a.cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get existing node: %w", err)
		}
		if node.Spec.PodCIDR != a.cfg.PodCIDR.String() {
			a.log.Warn("existing node has another podCIDR; pod IPs come from --pod-cidr anyway", "node_pod_cidr", node.Spec.PodCIDR, "pod_cidr", a.cfg.PodCIDR)
		}
	case err != nil:
		return fmt.Errorf("create node: %w", err)
	default:
		a.log.Info("node registered", "pod_cidr", node.Spec.PodCIDR)
	}
	a.nodeUID = node.UID
	return a.writeNodeStatus(ctx, node)
}

func (a *Agent) writeNodeStatus(ctx context.Context, node *corev1.Node) error {
	var err error
	if node == nil {
		node, err = a.cs.CoreV1().Nodes().Get(ctx, a.cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get node: %w", err)
		}
	}
	node = node.DeepCopy()
	st := a.nodeStatus(time.Now())
	// Keep the Ready condition's transition time across heartbeats.
	for _, old := range node.Status.Conditions {
		for i := range st.Conditions {
			if st.Conditions[i].Type == old.Type && st.Conditions[i].Status == old.Status {
				st.Conditions[i].LastTransitionTime = old.LastTransitionTime
			}
		}
	}
	st.Images, st.VolumesInUse, st.VolumesAttached = node.Status.Images, node.Status.VolumesInUse, node.Status.VolumesAttached
	node.Status = st
	if _, err := a.cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update node status: %w", err)
	}
	return nil
}

// heartbeat keeps the Node's Ready condition and its Lease fresh.
func (a *Agent) heartbeat(ctx context.Context) {
	status := time.NewTicker(a.cfg.StatusInterval)
	defer status.Stop()
	lease := time.NewTicker(a.cfg.LeaseRenewInterval)
	defer lease.Stop()
	a.renewLease(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-status.C:
			if err := a.writeNodeStatus(ctx, nil); err != nil && ctx.Err() == nil {
				a.log.Warn("node heartbeat", "err", err)
			}
		case <-lease.C:
			a.renewLease(ctx)
		}
	}
}

func (a *Agent) renewLease(ctx context.Context) {
	leases := a.cs.CoordinationV1().Leases(nodeLeaseNamespace)
	now := metav1.NewMicroTime(time.Now())
	l, err := leases.Get(ctx, a.cfg.NodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		l = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{
				Name:      a.cfg.NodeName,
				Namespace: nodeLeaseNamespace,
				OwnerReferences: []metav1.OwnerReference{{
					APIVersion: "v1", Kind: "Node", Name: a.cfg.NodeName, UID: a.nodeUID,
				}},
			},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       ptr.To(a.cfg.NodeName),
				LeaseDurationSeconds: ptr.To(int32(a.cfg.LeaseDuration / time.Second)),
				RenewTime:            &now,
			},
		}
		if _, err := leases.Create(ctx, l, metav1.CreateOptions{}); err != nil && ctx.Err() == nil {
			a.log.Warn("create node lease", "err", err)
		}
		return
	}
	if err != nil {
		if ctx.Err() == nil {
			a.log.Warn("get node lease", "err", err)
		}
		return
	}
	l.Spec.HolderIdentity = ptr.To(a.cfg.NodeName)
	l.Spec.LeaseDurationSeconds = ptr.To(int32(a.cfg.LeaseDuration / time.Second))
	l.Spec.RenewTime = &now
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil && ctx.Err() == nil {
		a.log.Warn("renew node lease", "err", err)
	}
}
