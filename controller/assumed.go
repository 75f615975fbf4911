package controller

import (
	"time"

	"skipper.dev/skipper/controller/api/v1alpha1"
)

// currentSet is the function's ready instance set: the informer's view plus
// claims it does not show yet, minus pods the caller found unusable.
func (c *controller) currentSet(fn *v1alpha1.Function, port int32, unusable []string) []instance {
	now := time.Now()
	pods := c.cache.functionPods(fn.Namespace, fn.Name)
	return instanceSet(fn, port, pods, c.claims.assumedPods(fn.Key(), pods, now), append(c.claims.retiredUIDs(now), unusable...))
}
