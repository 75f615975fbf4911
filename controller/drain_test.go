package controller

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// deleteFunc is a deleter answering err and recording what it was asked.
type deleteFunc func(ctx context.Context, name string, opts metav1.DeleteOptions) error

func (f deleteFunc) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	return f(ctx, name, opts)
}

func TestDeleteUID(t *testing.T) {
	pods := schema.GroupResource{Resource: "pods"}
	boom := errors.New("boom")
	tests := []struct {
		name        string
		err         error // the API server's answer
		wantDeleted bool
		wantErr     error
	}{
		{name: "deleted", wantDeleted: true},
		{name: "gone already", err: apierrors.NewNotFound(pods, "p")},
		{name: "replaced: the precondition failed", err: apierrors.NewConflict(pods, "p", errors.New("Precondition failed: UID in precondition: u1, UID in object meta: u2"))},
		{name: "any other error", err: boom, wantErr: boom},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var asked []string
			d := deleteFunc(func(_ context.Context, name string, opts metav1.DeleteOptions) error {
				if opts.Preconditions == nil || opts.Preconditions.UID == nil {
					t.Fatal("no UID precondition")
				}
				asked = append(asked, name+"/"+string(*opts.Preconditions.UID))
				return tt.err
			})
			deleted, err := deleteUID(t.Context(), d, "p", "u1")
			if deleted != tt.wantDeleted || !errors.Is(err, tt.wantErr) {
				t.Errorf("deleteUID = %v, %v; want %v, %v", deleted, err, tt.wantDeleted, tt.wantErr)
			}
			if diff := cmp.Diff([]string{"p/u1"}, asked); diff != "" {
				t.Errorf("deletes (-want +got):\n%s", diff)
			}
		})
	}
}
