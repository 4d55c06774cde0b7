#!/usr/bin/env bash
# Validates the manifests against the Kubernetes API schemas (strict: unknown fields are errors) with
# kubernetes-validate from PyPI, in a throwaway virtualenv under var/. No cluster is needed (or used).
set -euo pipefail
cd "$(dirname "$0")"
venv=../../var/kubernetes-validate
[ -x "$venv/bin/kubernetes-validate" ] || { python3 -m venv "$venv" && "$venv/bin/pip" install -q kubernetes-validate==1.37.0; }
manifests=$(ls *.yaml | grep -v '^kustomization.yaml$')
for version in 1.30.0 1.37.0; do
  "$venv/bin/kubernetes-validate" --strict --quiet -k "$version" $manifests
done
echo "deploy/kubernetes: $(echo $manifests | wc -w) files valid against Kubernetes 1.30 and 1.37 (strict)"
