//go:build tools

// Package crds names the Prometheus Operator's API types, from which tests/tools.sh
// has controller-gen write the CustomResourceDefinitions (and their OpenAPI schemas)
// that the Operator ships, to validate the chart's ServiceMonitor, PodMonitor and
// PrometheusRule offline. Nothing here is built into the exporter.
package crds

import _ "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
