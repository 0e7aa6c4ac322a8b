# shellcheck shell=bash
# (Sourced: $bin, $work and $ns_url are for the scripts that source it.)
# shellcheck disable=SC2034
# Used by bench/fetch: a local "release server" for torcx images.
# Source it from the repository's top, then: ns_begin TAG; ns_publish OS FILE VERSION;
# ns_node ROOT OS TAG MINOR VERSION; ns_args ROOT.
# Everything (CA, server certificate, OpenPGP key) is made for the run; nginx serves WORK/www
# over TLS on a free 127.0.0.1 port.

# ns_begin TAG: $bin (the release build, brought up to date, or $NODESTRAP_BIN), $work (removed
# on exit) and the server.
ns_begin() {
  if [ -n "${NODESTRAP_BIN:-}" ]; then
    bin=$(realpath "$NODESTRAP_BIN")
  else
    cargo build -q --release --target x86_64-unknown-linux-musl
    bin=$(realpath target/x86_64-unknown-linux-musl/release/nodestrap)
  fi
  work=$(mktemp -d "/var/tmp/nodestrap-$1.XXXXXX")
  trap 'ns_cleanup; rm -rf "$work"' EXIT
  ns_setup "$work"
}

ns_setup() {
  ns_work=$1
  mkdir -p "$ns_work/www"
  command -v nginx >/dev/null || { echo "nginx is missing: run .ci/setup first" >&2; return 1; }
  ( cd "$ns_work"
    exec 2> openssl.log
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=nodestrap-bench-ca \
      -keyout ca.key -out ca.pem
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=127.0.0.1 \
      -keyout srv.key -out srv.csr
    printf 'subjectAltName=IP:127.0.0.1\n' > san.ext
    openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile san.ext -out srv.pem
  ) || { cat "$ns_work/openssl.log" >&2; return 1; }
  export GNUPGHOME=$ns_work/gnupg
  mkdir -m 700 "$GNUPGHOME"
  gpg --batch --quiet --pinentry-mode loopback --passphrase '' --quick-gen-key 'release <release@nodestrap.invalid>' ed25519 sign never
  gpg --batch --armor --export > "$ns_work/keyring.asc"
  ns_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  cat > "$ns_work/nginx.conf" <<NGINX
daemon off;
worker_processes 1;
pid $ns_work/nginx.pid;
error_log $ns_work/nginx.err;
events { worker_connections 64; }
http {
  access_log off;
  client_body_temp_path $ns_work; proxy_temp_path $ns_work; fastcgi_temp_path $ns_work; uwsgi_temp_path $ns_work; scgi_temp_path $ns_work;
  server { listen 127.0.0.1:$ns_port ssl; ssl_certificate $ns_work/srv.pem; ssl_certificate_key $ns_work/srv.key; root $ns_work/www; }
}
NGINX
  nginx -c "$ns_work/nginx.conf" &
  ns_server=$!
  ns_url=https://127.0.0.1:$ns_port
  local _
  for _ in $(seq 50); do
    curl -s --cacert "$ns_work/ca.pem" -o /dev/null "$ns_url/" && return 0
    sleep 0.1
  done
  echo "nginx did not answer on $ns_url:" >&2
  cat "$ns_work/nginx.err" >&2 2>/dev/null
  return 1
}

ns_cleanup() {
  if [ -n "${ns_server:-}" ]; then
    kill "$ns_server" 2>/dev/null
    wait "$ns_server" 2>/dev/null || true
  fi
  gpgconf --kill gpg-agent 2>/dev/null
  return 0
}

# ns_publish OS FILE VERSION: offer FILE as docker:VERSION in OS's manifest, signed.
ns_publish() {
  local os=$1 file=$2 version=$3 hash dir
  dir=$ns_work/www/manifests/amd64-usr/$os
  mkdir -p "$dir" "$ns_work/www/pkgs"
  cp "$file" "$ns_work/www/pkgs/docker-$version.torcx.tgz"
  hash=$(sha512sum "$file" | cut -d' ' -f1)
  cat > "$dir/torcx_manifest.json" <<JSON
{"kind":"torcx-package-list-v0","value":{"packages":[{"name":"docker","defaultVersion":"$version","versions":[
 {"version":"$version","hash":"sha512-$hash","locations":[{"url":"$ns_url/pkgs/docker-$version.torcx.tgz"}]}]}]}}
JSON
  rm -f "$dir/torcx_manifest.json.asc"
  gpg --batch --armor --detach-sign "$dir/torcx_manifest.json"
}

# ns_node ROOT OS TAG MINOR VERSION: a Container Linux-like root whose installer files map
# Kubernetes MINOR to docker VERSION and name kubelet image tag TAG.
ns_node() {
  local root=$1 os=$2 tag=$3 minor=$4 version=$5
  rm -rf "$root"
  mkdir -p "$root/usr/lib" "$root/etc/kubernetes/installer"
  printf 'NAME="Flatcar Container Linux by Kinvolk"\nID=flatcar\nVERSION_ID=%s\nCOREOS_BOARD="amd64-usr"\n' "$os" > "$root/usr/lib/os-release"
  printf 'KUBELET_IMAGE_URL="quay.io/coreos/hyperkube"\nKUBELET_IMAGE_TAG="%s"\n' "$tag" > "$root/etc/kubernetes/installer/kubelet.env"
  printf 'kind: VersionManifestV1\nversions:\n  k8s:\n    %s:\n      docker: ["%s"]\n' "$minor" "$version" > "$root/etc/kubernetes/installer/runtime-mappings.yaml"
}

# Arguments for `nodestrap bootstrap` against ROOT and this server.
ns_args() {
  printf '%s\n' bootstrap --root "$1" --torcx-manifest-url "$ns_url/manifests/{{.Board}}/{{.OSVersion}}/torcx_manifest.json" \
    --keyring "$ns_work/keyring.asc" --ca-file "$ns_work/ca.pem" --upgrade-os=false
}
