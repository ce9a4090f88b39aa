# mk/kubernetes.mk — the Kubernetes manifests of the CSI driver (contrib/kubernetes, issue 38).
# Included by the top-level Makefile, whose GO, SUMMARY and TALLY it uses.
#
#   make test-k8s   the manifests' checks (tier k8s): every document decodes strictly into its
#                   Kubernetes API type (k8s.io/api), and the manifests agree with each other and
#                   with the plugin's parsers (internal/csipool). They are their own Go module,
#                   contrib/kubernetes/go.mod, so k8s.io/api is not a dependency of iser-blk;
#                   `go test ./...` at the root does not reach them, and lint vets them apart.

.PHONY: test-k8s

test-k8s:
	@set -o pipefail; mkdir -p bin; \
	$(GO) test -C contrib/kubernetes -count=1 -json ./... | $(SUMMARY) -tier k8s -tally $(TALLY)
