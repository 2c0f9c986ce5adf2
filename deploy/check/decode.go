package check

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Object is one decoded manifest document.
type Object struct {
	APIVersion, Kind, Name string
	Value                  any // *appsv1.Deployment, *corev1.Service, … , *InferencePool, *InferenceObjective
}

// kinds maps apiVersion/kind to a new value of its type; a document of
// another kind is an error.
var kinds = map[string]func() any{
	"apps/v1/Deployment":                           func() any { return new(appsv1.Deployment) },
	"v1/Service":                                   func() any { return new(corev1.Service) },
	"v1/ConfigMap":                                 func() any { return new(corev1.ConfigMap) },
	"networking.k8s.io/v1/NetworkPolicy":           func() any { return new(networkingv1.NetworkPolicy) },
	"gateway.networking.k8s.io/v1/HTTPRoute":       func() any { return new(gatewayv1.HTTPRoute) },
	"inference.networking.k8s.io/v1/InferencePool": func() any { return new(InferencePool) },
	"llm-d.ai/v1alpha2/InferenceObjective":         func() any { return new(InferenceObjective) },
}

var separator = regexp.MustCompile(`(?m)^---\s*$`)

// Decode strictly decodes every document of a multi-document YAML file:
// an unknown or duplicated field, a value of the wrong type, a kind not
// in kinds or a document without a name is an error.
func Decode(data []byte) ([]Object, error) {
	var out []Object
	for i, doc := range separator.Split(string(data), -1) {
		if len(bytes.TrimSpace(stripComments([]byte(doc)))) == 0 {
			continue
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			return nil, fmt.Errorf("document %d: %v", i+1, err)
		}
		mk, ok := kinds[head.APIVersion+"/"+head.Kind]
		if !ok {
			return nil, fmt.Errorf("document %d: apiVersion %q kind %q is not one this check knows", i+1, head.APIVersion, head.Kind)
		}
		if head.Metadata.Name == "" {
			return nil, fmt.Errorf("document %d (%s): no metadata.name", i+1, head.Kind)
		}
		// As the API server decodes: YAML to JSON (a key twice in a YAML
		// map is an error), then case-sensitive JSON with unknown and
		// duplicate fields refused, each named by its path.
		js, err := yaml.YAMLToJSONStrict([]byte(doc))
		if err != nil {
			return nil, fmt.Errorf("%s %s: %v", head.Kind, head.Metadata.Name, err)
		}
		v := mk()
		strict, err := sigsjson.UnmarshalStrict(js, v)
		if err == nil && len(strict) > 0 {
			err = errors.Join(strict...)
		}
		if err != nil {
			return nil, fmt.Errorf("%s %s: %v", head.Kind, head.Metadata.Name, err)
		}
		if val, ok := v.(interface{ Validate() error }); ok {
			if err := val.Validate(); err != nil {
				return nil, fmt.Errorf("%s %s: %v", head.Kind, head.Metadata.Name, err)
			}
		}
		out = append(out, Object{APIVersion: head.APIVersion, Kind: head.Kind, Name: head.Metadata.Name, Value: v})
	}
	return out, nil
}

func stripComments(doc []byte) []byte {
	var b bytes.Buffer
	for _, line := range bytes.Split(doc, []byte("\n")) {
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] != '#' {
			b.Write(line)
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}
