// Package kubernetes holds the Kubernetes manifests of iser-blk's CSI driver and, in its tests,
// their checks: every document of every manifest decodes strictly into its Kubernetes API type (a
// misspelt field fails here rather than at deploy time, or is dropped in silence where the API
// server's field validation is off), and the manifests agree with each other and with the
// plugin's own parsers (driver name, sockets, command line, pool file, volume attributes,
// StorageClass parameters).
package kubernetes
