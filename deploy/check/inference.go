// Package check is the schema check of the Kubernetes manifests in
// deploy/k8s (docs/DEPLOY.md): each document is decoded strictly (an
// unknown field is an error) into the upstream API types — k8s.io/api for
// Deployments, Services, ConfigMaps and NetworkPolicies,
// sigs.k8s.io/gateway-api for HTTPRoutes — and, for the Gateway API
// Inference Extension's InferencePool and llm-d's InferenceObjective, whose
// Go modules this build cannot fetch, into the field lists below, written
// from the upstream API types (inference.networking.k8s.io/v1
// api/v1/inferencepool_types.go of kubernetes-sigs/gateway-api-inference-
// extension v1.6; llm-d.ai/v1alpha2 apix/v1alpha2/inferenceobjective_types.go
// of llm-d/llm-d-router), with the validation their CRDs declare.
//
// It is a module of its own so that kvlm's go.mod does not carry
// Kubernetes: (cd deploy/check && go test ./...).
package check

import (
	"fmt"
	"regexp"
)

// InferencePool is inference.networking.k8s.io/v1 InferencePool: the
// model server pods a Gateway routes to, and the endpoint picker it asks
// which one.
type InferencePool struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   ObjectMeta        `json:"metadata"`
	Spec       InferencePoolSpec `json:"spec"`
}

// ObjectMeta is the part of metav1.ObjectMeta a manifest sets.
type ObjectMeta struct {
	Name        string            `json:"name"`
	Namespace   string            `json:"namespace,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// InferencePoolSpec: selector and targetPorts are required.
type InferencePoolSpec struct {
	Selector          LabelSelector      `json:"selector"`
	TargetPorts       []Port             `json:"targetPorts"`
	AppProtocol       string             `json:"appProtocol,omitempty"`
	EndpointPickerRef *EndpointPickerRef `json:"endpointPickerRef,omitempty"`
}

// LabelSelector selects pods by labels only (the pool has no expressions).
type LabelSelector struct {
	MatchLabels map[string]string `json:"matchLabels"`
}

// Port is a port number, 1 to 65535.
type Port struct {
	Number int32 `json:"number"`
}

// EndpointPickerRef names the endpoint picker: a Service (kind empty or
// "Service", then port is required) or another kind of group Group.
type EndpointPickerRef struct {
	Group       *string `json:"group,omitempty"`
	Kind        string  `json:"kind,omitempty"`
	Name        string  `json:"name"`
	Port        *Port   `json:"port,omitempty"`
	FailureMode string  `json:"failureMode,omitempty"`
}

// InferenceObjective is llm-d.ai/v1alpha2 InferenceObjective: a priority
// of the requests that name it, in one pool.
type InferenceObjective struct {
	APIVersion string                 `json:"apiVersion"`
	Kind       string                 `json:"kind"`
	Metadata   ObjectMeta             `json:"metadata"`
	Spec       InferenceObjectiveSpec `json:"spec"`
}

// InferenceObjectiveSpec: poolRef is required.
type InferenceObjectiveSpec struct {
	Priority *int32              `json:"priority,omitempty"`
	PoolRef  PoolObjectReference `json:"poolRef"`
}

// PoolObjectReference names an InferencePool of the same namespace (group
// inference.networking.k8s.io and kind InferencePool by default).
type PoolObjectReference struct {
	Group string `json:"group,omitempty"`
	Kind  string `json:"kind,omitempty"`
	Name  string `json:"name"`
}

var (
	groupRE = regexp.MustCompile(`^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	kindRE  = regexp.MustCompile(`^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$`)
	nameRE  = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

func checkName(what, name string) error {
	if len(name) == 0 || len(name) > 253 || !nameRE.MatchString(name) {
		return fmt.Errorf("%s %q is not a valid object name", what, name)
	}
	return nil
}

func checkPort(what string, p Port) error {
	if p.Number < 1 || p.Number > 65535 {
		return fmt.Errorf("%s %d is not a port number (1 to 65535)", what, p.Number)
	}
	return nil
}

// Validate checks what the InferencePool CRD declares.
func (p *InferencePool) Validate() error {
	if err := checkName("metadata.name", p.Metadata.Name); err != nil {
		return err
	}
	s := p.Spec
	if len(s.Selector.MatchLabels) == 0 || len(s.Selector.MatchLabels) > 64 {
		return fmt.Errorf("spec.selector.matchLabels needs 1 to 64 labels, has %d", len(s.Selector.MatchLabels))
	}
	if len(s.TargetPorts) == 0 || len(s.TargetPorts) > 8 {
		return fmt.Errorf("spec.targetPorts needs 1 to 8 ports, has %d", len(s.TargetPorts))
	}
	seen := map[int32]bool{}
	for _, tp := range s.TargetPorts {
		if err := checkPort("spec.targetPorts[].number", tp); err != nil {
			return err
		}
		if seen[tp.Number] {
			return fmt.Errorf("spec.targetPorts: port number %d twice", tp.Number)
		}
		seen[tp.Number] = true
	}
	switch s.AppProtocol {
	case "", "http", "kubernetes.io/h2c":
	default:
		return fmt.Errorf("spec.appProtocol %q is none of http, kubernetes.io/h2c", s.AppProtocol)
	}
	if r := s.EndpointPickerRef; r != nil {
		if r.Group != nil && (len(*r.Group) > 253 || !groupRE.MatchString(*r.Group)) {
			return fmt.Errorf("spec.endpointPickerRef.group %q is not a valid group", *r.Group)
		}
		if r.Kind != "" && (len(r.Kind) > 63 || !kindRE.MatchString(r.Kind)) {
			return fmt.Errorf("spec.endpointPickerRef.kind %q is not a valid kind", r.Kind)
		}
		if err := checkName("spec.endpointPickerRef.name", r.Name); err != nil {
			return err
		}
		if (r.Kind == "" || r.Kind == "Service") && r.Port == nil {
			return fmt.Errorf("spec.endpointPickerRef.port is required when kind is Service or unset")
		}
		if r.Port != nil {
			if err := checkPort("spec.endpointPickerRef.port.number", *r.Port); err != nil {
				return err
			}
		}
		switch r.FailureMode {
		case "", "FailOpen", "FailClose":
		default:
			return fmt.Errorf("spec.endpointPickerRef.failureMode %q is none of FailOpen, FailClose", r.FailureMode)
		}
	}
	return nil
}

// Validate checks what the InferenceObjective CRD declares.
func (o *InferenceObjective) Validate() error {
	if err := checkName("metadata.name", o.Metadata.Name); err != nil {
		return err
	}
	r := o.Spec.PoolRef
	if len(r.Group) > 253 || !groupRE.MatchString(r.Group) {
		return fmt.Errorf("spec.poolRef.group %q is not a valid group", r.Group)
	}
	if r.Kind != "" && (len(r.Kind) > 63 || !kindRE.MatchString(r.Kind)) {
		return fmt.Errorf("spec.poolRef.kind %q is not a valid kind", r.Kind)
	}
	return checkName("spec.poolRef.name", r.Name)
}
