#!/usr/bin/python3
"""Host-side servers for the QEMU scenarios, on 127.0.0.1 only (the guest reaches them at
10.0.2.2 through QEMU's user network), both over TLS with a certificate from the run's CA:

* the release server: static files under --www (torcx manifests, their .asc signatures,
  images), GET and HEAD, no listings;
* a fake Kubernetes API server that speaks the real paths, auth and JSON for what nodestrap
  asks: GET /version, GET /api/v1/namespaces/NS/configmaps/NAME, GET and merge-PATCH
  /api/v1/nodes/NAME (labels only), bearer token required, errors as metav1.Status objects;
* on the release server, for the in-place bootstrapper: a machine-config-server's /ignition
  behind its own bearer token, a registry's /v2/ (401: wants credentials), and a progress
  endpoint (POST /progress/events, its own token) that appends each event to --progress-log;
  with --client-ca, the release server asks for an optional client certificate and the progress
  endpoint also takes a node's certificate from that CA (O=system:nodes: the kubelet's client
  certificate, which nodestrap's events present once the node has joined) in place of the token.

Every request is logged to --log as one line. Prints "ready RELEASE_PORT API_PORT" when both
listen."""
import argparse
import http.server
import json
import os
import ssl
import sys
import threading
import time

ap = argparse.ArgumentParser()
ap.add_argument("--www", required=True)
ap.add_argument("--cert", required=True)
ap.add_argument("--key", required=True)
ap.add_argument("--token", required=True, help="file holding the API server's bearer token")
ap.add_argument("--git-version", required=True, help="the version /version reports, or @FILE to read it per request")
ap.add_argument("--configmaps", required=True, help="JSON file: {\"ns/name\": {key: value}}")
ap.add_argument("--log", required=True)
ap.add_argument("--ignition", help="file served at /ignition")
ap.add_argument("--ign-token", help="file holding /ignition's bearer token")
ap.add_argument("--progress-token", help="file holding the progress endpoint's bearer token")
ap.add_argument("--progress-log", help="file the progress events are appended to (JSON lines)")
ap.add_argument("--client-ca", help="PEM CA whose node certificates the progress endpoint takes as identity")
ap.add_argument("--nodes", help="JSON file: {\"name\": {label: value}}")
a = ap.parse_args()
ign_token = open(a.ign_token).read().strip() if a.ign_token else None
progress_token = open(a.progress_token).read().strip() if a.progress_token else None
nodes = json.load(open(a.nodes)) if a.nodes else {}
token = open(a.token).read().strip()
configmaps = json.load(open(a.configmaps))
log_lock = threading.Lock()
t0 = time.time()


def log(line):
    with log_lock, open(a.log, "a") as f:
        f.write("%.3f %s\n" % (time.time(), line))


class Base(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    kind = ""

    def log_message(self, fmt, *args):
        pass

    def send(self, code, body, ctype):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        who = getattr(self, "who", None)
        log("%s %s %s %d %d%s" % (self.kind, self.command, self.path, code, len(body), " as=" + who if who else ""))


class Release(Base):
    kind = "release"

    def bearer(self, token):
        return token is not None and self.headers.get("Authorization", "") == "Bearer " + token

    def progress_identity(self):
        """Who posts an event: `token`, or `cert:CN` for a node certificate from --client-ca."""
        if self.bearer(progress_token):
            return "token"
        cert = self.connection.getpeercert() if a.client_ca else None
        if cert:
            subject = dict(kv for rdn in cert.get("subject", ()) for kv in rdn)
            if subject.get("organizationName") == "system:nodes":
                return "cert:" + subject.get("commonName", "")
        return None

    def do_GET(self):
        self.who = None
        path = self.path.split("?", 1)[0]
        if path == "/ignition" and a.ignition:
            if not self.bearer(ign_token):
                return self.send(401, b"missing or wrong token\n", "text/plain")
            return self.send(200, open(a.ignition, "rb").read(), "application/vnd.coreos.ignition+json")
        if path == "/v2/":
            return self.send(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}', "application/json")
        if path == "/progress/events":
            return self.send(405, b"POST only\n", "text/plain")
        rel = path.lstrip("/")
        full = os.path.realpath(os.path.join(a.www, rel))
        if not full.startswith(os.path.realpath(a.www) + os.sep) or not os.path.isfile(full):
            return self.send(404, b"not found\n", "text/plain")
        self.send(200, open(full, "rb").read(), "application/octet-stream")

    do_HEAD = do_GET

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.who = None
        if self.path != "/progress/events" or not a.progress_log:
            return self.send(404, b"not found\n", "text/plain")
        self.who = self.progress_identity()
        if self.who is None:
            return self.send(401, b"missing or wrong token\n", "text/plain")
        try:
            event = json.loads(body)
        except ValueError:
            return self.send(400, b"not JSON\n", "text/plain")
        with log_lock, open(a.progress_log, "a") as f:
            f.write(json.dumps(event) + "\n")
        self.send(200, b"{}", "application/json")


class Api(Base):
    kind = "api"

    def status(self, code, reason, message):
        body = json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                           "message": message, "reason": reason, "code": code}).encode()
        self.send(code, body, "application/json")

    def node(self, name):
        body = {"kind": "Node", "apiVersion": "v1",
                "metadata": {"name": name, "uid": "00000000-0000-0000-0000-000000000002",
                             "resourceVersion": "1", "labels": nodes[name]}}
        return self.send(200, json.dumps(body).encode(), "application/json")

    def do_PATCH(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.headers.get("Authorization", "") != "Bearer " + token:
            return self.status(401, "Unauthorized", "Unauthorized")
        parts = self.path.split("?", 1)[0].strip("/").split("/")
        if len(parts) != 4 or parts[:3] != ["api", "v1", "nodes"] or parts[3] not in nodes:
            return self.status(404, "NotFound", "the server could not find the requested resource")
        if self.headers.get("Content-Type") != "application/merge-patch+json":
            return self.status(415, "UnsupportedMediaType", "expected a merge patch")
        try:
            patch = json.loads(body)
        except ValueError:
            return self.status(400, "BadRequest", "the patch is not JSON")
        log("api PATCH-BODY %s %s" % (self.path, json.dumps(patch, sort_keys=True)))
        with log_lock:  # handlers run in threads
            for k, v in patch.get("metadata", {}).get("labels", {}).items():
                if v is None:
                    nodes[parts[3]].pop(k, None)
                else:
                    nodes[parts[3]][k] = v
        self.node(parts[3])

    def do_GET(self):
        if self.headers.get("Authorization", "") != "Bearer " + token:
            return self.status(401, "Unauthorized", "Unauthorized")
        path = self.path.split("?", 1)[0]
        parts = path.strip("/").split("/")
        if len(parts) == 4 and parts[:3] == ["api", "v1", "nodes"] and parts[3] in nodes:
            return self.node(parts[3])
        if path == "/version":
            v = a.git_version
            if v.startswith("@"):
                v = open(v[1:]).read().strip()
            major, minor = v.lstrip("v").split(".")[:2]
            body = {"major": major, "minor": minor, "gitVersion": v, "gitCommit": "0" * 40,
                    "gitTreeState": "clean", "buildDate": "2018-03-21T15:13:31Z",
                    "goVersion": "go1.9.3", "compiler": "gc", "platform": "linux/amd64"}
            return self.send(200, json.dumps(body).encode(), "application/json")
        parts = path.strip("/").split("/")
        if len(parts) == 6 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "configmaps":
            ns, name = parts[3], parts[5]
            data = configmaps.get(ns + "/" + name)
            if data is None:
                return self.status(404, "NotFound", 'configmaps "%s" not found' % name)
            body = {"kind": "ConfigMap", "apiVersion": "v1",
                    "metadata": {"name": name, "namespace": ns, "uid": "00000000-0000-0000-0000-000000000001",
                                 "resourceVersion": "1", "creationTimestamp": "2018-03-21T15:13:31Z"},
                    "data": data}
            return self.send(200, json.dumps(body).encode(), "application/json")
        self.status(404, "NotFound", "the server could not find the requested resource")


def serve(handler, client_ca=None):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(a.cert, a.key)
    if client_ca:
        ctx.load_verify_locations(client_ca)
        ctx.verify_mode = ssl.CERT_OPTIONAL
    # The handshake happens in each connection's thread: a silent client stalls only itself.
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True, do_handshake_on_connect=False)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv.server_address[1]


rp, apip = serve(Release, a.client_ca), serve(Api)
print("ready %d %d" % (rp, apip), flush=True)
try:
    while True:
        time.sleep(3600)
except KeyboardInterrupt:
    sys.exit(0)
