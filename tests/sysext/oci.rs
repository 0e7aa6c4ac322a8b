//! `--sysext-url oci://…`: the signed source published to Debian's real `docker-registry` by
//! deploy/publish-oci, read back by skopeo (a real OCI client) as the artifacts
//! docs/oci.md describes, and staged by nodestrap by digest. Trust stays with the signed
//! SHA256SUMS: a tag the registry moved is not followed, a blob swapped in its storage is
//! refused and nothing is staged. Needs docker-registry, skopeo and htpasswd (apache2-utils).

use super::*;

const USER: &str = "node";
const PASSWORD: &str = "pull-only-s3cret";

/// A signed source laid out as deploy/sign-sysext-source lays it out (SOURCE/<ext>/: images,
/// SHA256SUMS, SHA256SUMS.gpg), signed by `w`'s key: kubernetes v1.32.1 and v1.32.3,
/// containerd 1.7.24. The files, by name.
fn signed_source(w: &World) -> (PathBuf, Vec<(String, Vec<u8>)>) {
    signed_source_padded(w, 0)
}

/// `signed_source` with `pad` bytes of incompressible data in the containerd image.
fn signed_source_padded(w: &World, pad: usize) -> (PathBuf, Vec<(String, Vec<u8>)>) {
    let dir = unique_dir("oci-source");
    let mut all = Vec::new();
    let sets = [
        (
            "kubernetes",
            vec![
                (
                    "kubernetes-v1.32.1-x86-64.raw",
                    kubernetes(&w.work, "1.32.1", ANY),
                ),
                (
                    "kubernetes-v1.32.3-x86-64.raw",
                    kubernetes(&w.work, "1.32.3", ANY),
                ),
            ],
        ),
        (
            "containerd",
            vec![(
                "containerd-1.7.24-x86-64.raw",
                containerd(&w.work, "1.7.24", pad),
            )],
        ),
    ];
    for (ext, images) in sets {
        let d = dir.join(ext);
        std::fs::create_dir_all(&d).unwrap();
        let mut sums = String::new();
        for (f, b) in images {
            sums.push_str(&format!("{}  {f}\n", sha256(&b)));
            std::fs::write(d.join(f), &b).unwrap();
            all.push((f.to_string(), b));
        }
        std::fs::write(d.join("SHA256SUMS"), &sums).unwrap();
        std::fs::write(
            d.join("SHA256SUMS.gpg"),
            w.signer.sign_binary(sums.as_bytes()),
        )
        .unwrap();
    }
    (dir, all)
}

/// A fresh node (its own root) that trusts the registry's CA beside the world's.
fn node_for(ca: &Ca) -> World {
    let w = World::new();
    let mut pem = std::fs::read_to_string(&w.ca_file).unwrap();
    pem.push_str(&ca.pem);
    std::fs::write(&w.ca_file, pem).unwrap();
    w
}

/// skopeo, a real OCI client, with the registry's CA and the node's credentials.
fn skopeo(reg: &Registry, ca: &Ca, args: &[String]) -> String {
    let certs = unique_dir("skopeo-certs");
    std::fs::write(certs.join("ca.crt"), &ca.pem).unwrap();
    let mut c = Command::new("skopeo");
    c.arg(args[0].as_str());
    for a in &args[1..] {
        c.arg(a.replace("{certs}", &certs.display().to_string()));
    }
    let out = c
        .output()
        .expect("skopeo (Debian package skopeo) must be installed");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "skopeo {args:?}: {said}{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        reg.log()
    );
    said
}

fn raw_manifest(reg: &Registry, ca: &Ca, repo: &str, tag: &str) -> serde_json::Value {
    let m = skopeo(
        reg,
        ca,
        &[
            "inspect".into(),
            "--raw".into(),
            format!("--creds={USER}:{PASSWORD}"),
            "--cert-dir={certs}".into(),
            format!("docker://{}/{repo}:{tag}", reg.host()),
        ],
    );
    serde_json::from_str(&m).unwrap()
}

#[test]
fn a_registry_serves_the_signed_source_by_digest() {
    let ca = Ca::new("registry CA");
    let reg = Registry::start(
        &ca,
        RegistryAuth::Basic {
            user: USER.into(),
            password: PASSWORD.into(),
        },
        None,
    );
    let auth = reg.auth_json(USER, PASSWORD);
    let mut w = node_for(&ca);
    let (source, files) = signed_source(&w);
    let said = reg.publish(&source, "flatcar", Some(&auth), &w.ca_file);
    // Images first, the list and its signature last.
    let order: Vec<&str> = said
        .lines()
        .map(|l| l.split(" -> ").next().unwrap())
        .collect();
    assert_eq!(
        order,
        [
            "flatcar/containerd:containerd-1.7.24-x86-64.raw",
            "flatcar/containerd:SHA256SUMS",
            "flatcar/containerd:SHA256SUMS.gpg",
            "flatcar/kubernetes:kubernetes-v1.32.1-x86-64.raw",
            "flatcar/kubernetes:kubernetes-v1.32.3-x86-64.raw",
            "flatcar/kubernetes:SHA256SUMS",
            "flatcar/kubernetes:SHA256SUMS.gpg",
        ],
        "{said}"
    );

    // The oracle reads the shape docs/oci.md names, and pulls the artifact whole.
    let (name, body) = &files[1];
    let m = raw_manifest(&reg, &ca, "flatcar/kubernetes", name);
    assert_eq!(m["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    assert_eq!(m["artifactType"], "application/vnd.nodestrap.file.v1");
    assert_eq!(
        m["config"]["mediaType"],
        "application/vnd.oci.empty.v1+json"
    );
    assert_eq!(m["layers"][0]["digest"], format!("sha256:{}", sha256(body)));
    assert_eq!(m["layers"][0]["size"], body.len());
    assert_eq!(
        m["layers"][0]["annotations"]["org.opencontainers.image.title"],
        name.as_str()
    );
    let pulled = unique_dir("skopeo-pull");
    skopeo(
        &reg,
        &ca,
        &[
            "copy".into(),
            format!("--src-creds={USER}:{PASSWORD}"),
            "--src-cert-dir={certs}".into(),
            format!("docker://{}/flatcar/kubernetes:{name}", reg.host()),
            format!("dir:{}", pulled.display()),
        ],
    );
    assert_eq!(
        std::fs::read(pulled.join(sha256(body))).unwrap(),
        *body,
        "skopeo's copy of the layer"
    );

    let url = format!("oci://{}/flatcar/${{NAME}}", reg.host());
    // Without credentials: refused, naming the option, and nothing staged.
    let mut a = w.args_for(&w.root.display().to_string());
    a.retain(|x| !x.starts_with("--sysext-url"));
    a.push(format!("--sysext-url={url}"));
    let r = nodestrap(&a, None, &[]);
    r.assert_fails(1, "--registry-auth");
    assert!(!r.stderr.contains(PASSWORD));
    w.assert_nothing_staged();

    // With the kubelet's kind of config.json: staged from the registry, bytes as published.
    w.extra.push(format!("--registry-auth={}", auth.display()));
    stages_from(&w, &url, &w.keyring);
    staged_as_published(&w, &files);

    // The registry moves kubernetes v1.32.3's tag to v1.32.1's artifact: not followed, since
    // the signed list names the blob.
    skopeo(
        &reg,
        &ca,
        &[
            "copy".into(),
            format!("--src-creds={USER}:{PASSWORD}"),
            format!("--dest-creds={USER}:{PASSWORD}"),
            "--src-cert-dir={certs}".into(),
            "--dest-cert-dir={certs}".into(),
            format!(
                "docker://{}/flatcar/kubernetes:kubernetes-v1.32.1-x86-64.raw",
                reg.host()
            ),
            format!(
                "docker://{}/flatcar/kubernetes:kubernetes-v1.32.3-x86-64.raw",
                reg.host()
            ),
        ],
    );
    let moved = raw_manifest(
        &reg,
        &ca,
        "flatcar/kubernetes",
        "kubernetes-v1.32.3-x86-64.raw",
    );
    assert_eq!(
        moved["layers"][0]["digest"],
        format!("sha256:{}", sha256(&files[0].1)),
        "the tag names v1.32.1's image now"
    );
    let mut w2 = node_for(&ca);
    w2.extra.push(format!("--registry-auth={}", auth.display()));
    stages_from(&w2, &url, &w.keyring);
    assert_eq!(
        std::fs::read(w2.path("/opt/extensions/kubernetes/kubernetes-v1.32.3-x86-64.raw")).unwrap(),
        files[1].1
    );

    // A blob swapped in the registry's storage (same length): refused, nothing staged.
    let (_, ctd) = &files[2];
    let mut other = ctd.clone();
    let last = other.len() - 1;
    other[last] ^= 0xff;
    std::fs::write(reg.blob(&sha256(ctd)), &other).unwrap();
    let mut w3 = node_for(&ca);
    w3.extra.push(format!("--registry-auth={}", auth.display()));
    let mut a = w3.args_for(&w3.root.display().to_string());
    a.retain(|x| !x.starts_with("--sysext-url") && !x.starts_with("--keyring"));
    a.push(format!("--sysext-url={url}"));
    a.push(format!("--keyring={}", w.keyring.display()));
    let r = nodestrap(&a, None, &[]);
    r.assert_fails(1, "hash mismatch");
    assert!(
        r.stderr.contains(&format!("sha256:{}", sha256(ctd))),
        "{}",
        r.stderr
    );
    w3.assert_nothing_staged();
}

/// A Docker config.json of its own, `name` in a fresh folder, with one `auths` entry: `key`
/// with `user:password`.
fn config_json(name: &str, key: &str, user: &str, password: &str) -> PathBuf {
    let p = unique_dir("registry-auth").join(name);
    std::fs::write(
        &p,
        serde_json::json!({"auths": {key: {"auth": basic_secret(user, password)}}}).to_string(),
    )
    .unwrap();
    p
}

/// base64 of `user:password`: the `auth` string of a config.json, and Basic's credentials.
fn basic_secret(user: &str, password: &str) -> String {
    base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        format!("{user}:{password}"),
    )
}

/// Neither output of `r` holds a password or an `auth` string of `secrets`.
fn no_secret(r: &Run, secrets: &[(&str, &str)]) {
    for (user, password) in secrets {
        for out in [&r.stdout, &r.stderr] {
            assert!(
                !out.contains(password) && !out.contains(&basic_secret(user, password)),
                "a secret reached the output:\n{out}"
            );
        }
    }
}

#[test]
fn refused_credentials_are_named_by_their_file_and_entry_never_by_their_secret() {
    let ca = Ca::new("registry CA");
    let reg = Registry::start(
        &ca,
        RegistryAuth::Basic {
            user: USER.into(),
            password: PASSWORD.into(),
        },
        None,
    );
    let w = node_for(&ca);
    let (source, files) = signed_source(&w);
    let push = reg.auth_json(USER, PASSWORD);
    reg.publish(&source, "flatcar", Some(&push), &w.ca_file);
    let url = format!("oci://{}/flatcar/${{NAME}}", reg.host());
    let host = reg.host();
    let wrong = "not-the-pull-password";
    let run_with = |auth: &Path| {
        let mut node = node_for(&ca);
        node.extra
            .push(format!("--registry-auth={}", auth.display()));
        (run_from(&node, &url, &w.keyring), node)
    };

    // A wrong password: the registry's Basic refuses it (401), and the error names the file
    // as given and the entry, never the password or the auth string.
    let bad = config_json("wrong.json", &host, USER, wrong);
    let (r, node) = run_with(&bad);
    r.assert_fails(
        1,
        &format!(
            "registry {host} refused the Basic credentials of auths entry {host} in --registry-auth {}: GET https://{host}/v2/flatcar/",
            bad.display()
        ),
    );
    assert!(r.stderr.contains("HTTP 401"), "{}", r.stderr);
    no_secret(&r, &[(USER, wrong), (USER, PASSWORD)]);
    node.assert_nothing_staged();

    // No entry for the registry's host: said so, naming the file and the host looked up.
    let other = config_json("other.json", "other.example:5000", USER, PASSWORD);
    let (r, node) = run_with(&other);
    r.assert_fails(
        1,
        &format!(
            "registry {host} asks for credentials: --registry-auth {} has no auths entry for {host}",
            other.display()
        ),
    );
    no_secret(&r, &[(USER, PASSWORD)]);
    node.assert_nothing_staged();

    // The twin: the same entry with the right password stages the published bytes.
    let good = config_json("right.json", &host, USER, PASSWORD);
    let (r, node) = run_with(&good);
    r.assert_ok();
    no_secret(&r, &[(USER, PASSWORD)]);
    staged_as_published(&node, &files);
}

#[test]
fn bearer_tokens_are_kept_per_repository_until_they_end_and_a_redirect_gets_no_credentials() {
    let ca = Ca::new("registry CA");
    // The token endpoint (distribution only consumes tokens) and the server the registry's
    // redirect middleware sends blob downloads to, as a registry in front of object storage.
    let tokens = Server::start(&ca.server(), None);
    let blobs = Server::start(&ca.server(), None);
    let dir = unique_dir("token-issuer");
    let issuer = TokenIssuer::new(&dir);
    let (service, iss) = ("nodestrap-test-registry", "nodestrap-test-issuer");
    let reg = Registry::start(
        &ca,
        RegistryAuth::Token {
            realm: tokens.url("/token"),
            service: service.into(),
            issuer: iss.into(),
            bundle: issuer.bundle.clone(),
        },
        Some(&blobs.url("/")),
    );
    let auth = reg.auth_json(USER, PASSWORD);
    let repos = ["flatcar/kubernetes", "flatcar/containerd"];
    let answer = |secs: u64| {
        Reply::ok(
            serde_json::json!({"token": issuer.token(iss, service, &repos, secs.max(300)), "expires_in": secs})
                .to_string(),
        )
    };
    let scope = |repo: &str, actions: &str| {
        format!(
            "/token?scope=repository%3A{}%3A{}&service={service}",
            repo.replace('/', "%2F"),
            actions.replace(',', "%2C")
        )
    };
    for repo in repos {
        tokens.set(&scope(repo, "pull,push"), answer(300));
        tokens.set(&scope(repo, "pull"), answer(300));
    }
    let mut w = node_for(&ca);
    let (source, files) = signed_source(&w);
    reg.publish(&source, "flatcar", Some(&auth), &w.ca_file);
    // The blob store behind the redirect: every blob the registry holds, at its storage path.
    for e in walk(&reg.storage.join("docker/registry/v2/blobs")) {
        let rel = e.strip_prefix(&reg.storage).unwrap().display().to_string();
        blobs.set(&format!("/{rel}"), Reply::ok(std::fs::read(&e).unwrap()));
    }

    w.extra.push(format!("--registry-auth={}", auth.display()));
    let url = format!("oci://{}/flatcar/${{NAME}}", reg.host());
    stages_from(&w, &url, &w.keyring);
    let basic = format!(
        "Basic {}",
        base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            format!("{USER}:{PASSWORD}")
        )
    );
    let pulls = |repo: &str| tokens.requests("GET", &scope(repo, "pull"));
    for repo in repos {
        let asked = pulls(repo);
        // One token per repository, kept for its manifests and blobs.
        assert_eq!(asked.len(), 1, "{repo}: {:?}", tokens.seen());
        assert_eq!(asked[0].header("authorization"), Some(basic.as_str()));
    }
    // The images came from the blob store, which never saw the registry's credentials.
    let k = &files[1].1;
    let k_path = format!(
        "/docker/registry/v2/blobs/sha256/{}/{}/data",
        &sha256(k)[..2],
        sha256(k)
    );
    assert!(blobs.hits(&k_path) >= 1, "{:?}", blobs.seen());
    assert!(
        blobs
            .seen()
            .iter()
            .all(|s| s.header("authorization").is_none()),
        "the blob store got an Authorization header for {:?}",
        blobs
            .seen()
            .iter()
            .filter(|s| s.header("authorization").is_some())
            .map(|s| &s.path)
            .collect::<Vec<_>>()
    );
    assert_eq!(
        std::fs::read(w.path("/opt/extensions/kubernetes/kubernetes-v1.32.3-x86-64.raw")).unwrap(),
        *k
    );

    // Tokens that end at once are not kept: each request asks for a new one (the first run
    // asked once per repository; this one asks for its two manifests and three blobs).
    for repo in repos {
        tokens.set(&scope(repo, "pull"), answer(1));
    }
    let mut w2 = node_for(&ca);
    w2.extra.push(format!("--registry-auth={}", auth.display()));
    stages_from(&w2, &url, &w.keyring);
    for repo in repos {
        assert_eq!(pulls(repo).len(), 1 + 5, "{repo}");
    }

    // The token endpoint refuses the node's credentials (401; the stand-in endpoint answers so
    // to every pull token request, it does not check passwords): the error names the realm,
    // the file as given and the entry, never the password or the auth string.
    let realm = tokens.url("/token");
    let host = reg.host();
    let wrong = "not-the-pull-password";
    let bad = config_json("wrong.json", &host, USER, wrong);
    for repo in repos {
        tokens.set(&scope(repo, "pull"), Reply::status(401));
    }
    let mut w3 = node_for(&ca);
    w3.extra.push(format!("--registry-auth={}", bad.display()));
    let r = run_from(&w3, &url, &w.keyring);
    r.assert_fails(
        1,
        &format!(
            "token endpoint {realm} refused the credentials of auths entry {host} in --registry-auth {}: GET {realm}?scope=",
            bad.display()
        ),
    );
    no_secret(&r, &[(USER, wrong), (USER, PASSWORD)]);
    let asked = tokens.seen();
    let last = asked.last().unwrap();
    assert_eq!(
        last.header("authorization"),
        Some(format!("Basic {}", basic_secret(USER, wrong)).as_str()),
        "the endpoint was sent the file's credentials"
    );
    w3.assert_nothing_staged();

    // The endpoint gives a token the registry refuses (for another service): named as the
    // token from that realm, for that entry.
    for repo in repos {
        tokens.set(
            &scope(repo, "pull"),
            Reply::ok(
                serde_json::json!({"token": issuer.token(iss, "another-service", &repos, 300)})
                    .to_string(),
            ),
        );
    }
    let r = run_from(&w3, &url, &w.keyring);
    r.assert_fails(
        1,
        &format!(
            "registry {host} refused the token {realm} gave for the credentials of auths entry {host} in --registry-auth {}: GET https://{host}/v2/flatcar/",
            bad.display()
        ),
    );
    no_secret(&r, &[(USER, wrong)]);
    w3.assert_nothing_staged();

    // The twin: the endpoint gives tokens again, and the same entry with the right password
    // stages.
    for repo in repos {
        tokens.set(&scope(repo, "pull"), answer(300));
    }
    let mut w4 = node_for(&ca);
    let good = config_json("right.json", &host, USER, PASSWORD);
    w4.extra.push(format!("--registry-auth={}", good.display()));
    stages_from(&w4, &url, &w.keyring);
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// The node staged the chosen images byte for byte as published.
fn staged_as_published(w: &World, files: &[(String, Vec<u8>)]) {
    for (f, ext) in [
        ("kubernetes-v1.32.3-x86-64.raw", "kubernetes"),
        ("containerd-1.7.24-x86-64.raw", "containerd"),
    ] {
        let want = &files.iter().find(|(n, _)| n == f).unwrap().1;
        assert_eq!(
            std::fs::read(w.path(&format!("/opt/extensions/{ext}/{f}"))).unwrap(),
            *want,
            "{f}"
        );
    }
}

/// The registry's blobs as (hex, bytes), from its storage.
fn stored_blobs(reg: &Registry) -> Vec<(String, Vec<u8>)> {
    walk(&reg.storage.join("docker/registry/v2/blobs"))
        .into_iter()
        .map(|p| {
            let hex = p.parent().unwrap().file_name().unwrap();
            (
                hex.to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect()
}

/// `hosts.toml` for registry `reg` in the node's containerd config path (containerd's
/// `<config_path>/<host:port>/`), with `files` beside it.
fn hosts_toml(w: &World, reg: &Registry, toml: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = w.path(&format!("/etc/containerd/certs.d/{}", reg.host()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("hosts.toml"), toml).unwrap();
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
    dir
}

fn run_from(w: &World, url: &str, keyring: &Path) -> Run {
    let mut a = w.args_for(&w.root.display().to_string());
    a.retain(|x| !x.starts_with("--sysext-url") && !x.starts_with("--keyring"));
    a.push(format!("--sysext-url={url}"));
    a.push(format!("--keyring={}", keyring.display()));
    nodestrap(&a, None, &[])
}

#[test]
fn mirrors_from_hosts_toml_are_tried_in_order_and_a_pull_only_mirror_never_resolves() {
    let ca = Ca::new("registry CA");
    let origin = Registry::start(
        &ca,
        RegistryAuth::Basic {
            user: USER.into(),
            password: PASSWORD.into(),
        },
        None,
    );
    let auth = origin.auth_json(USER, PASSWORD);
    let w = node_for(&ca);
    let (source, files) = signed_source(&w);
    origin.publish(&source, "flatcar", Some(&auth), &w.ca_file);

    // A mirror that is down, then a pull-only mirror under its own CA (named only in
    // hosts.toml) that wants a client certificate, then the registry.
    let down = dead_port();
    let mirror_ca = Ca::new("mirror CA");
    let client_ca = Ca::new("mirror clients CA");
    let client = client_ca.client("node-1");
    let mirror = Server::start(&mirror_ca.server(), Some(&client_ca));
    // containerd's `ns`, as Go's url.Values.Encode writes it: the port's colon is %3A.
    let ns = format!("?ns=127.0.0.1%3A{}", origin.port);
    mirror.set("/v2/", Reply::ok("{}"));
    for repo in ["flatcar/kubernetes", "flatcar/containerd"] {
        for (hex, body) in stored_blobs(&origin) {
            mirror.set(
                &format!("/v2/{repo}/blobs/sha256:{hex}{ns}"),
                Reply::ok(body),
            );
        }
    }
    let mut w = w;
    w.extra.push(format!("--registry-auth={}", auth.display()));
    hosts_toml(
        &w,
        &origin,
        &format!(
            r#"# as containerd reads it
[host."https://127.0.0.1:{down}"]
  capabilities = ["pull", "resolve"]

[host."https://127.0.0.1:{}"]
  capabilities = ["pull"]
  ca = "mirror-ca.pem"
  client = [["client.pem", "/etc/containerd/certs.d/{}/client.key"]]
  [host."https://127.0.0.1:{}".header]
    X-Fleet = ["blue", "green"]
"#,
            mirror.port,
            origin.host(),
            mirror.port
        ),
        &[
            ("mirror-ca.pem", &mirror_ca.pem),
            ("client.pem", &client.cert_pem),
            ("client.key", &client.key_pem),
        ],
    );
    let url = format!("oci://{}/flatcar/${{NAME}}", origin.host());
    let r = run_from(&w, &url, &w.keyring);
    r.assert_ok();
    assert!(
        r.stderr
            .contains(&format!("mirror https://127.0.0.1:{down}/v2")),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("trying the next host"), "{}", r.stderr);
    assert!(!r.stderr.contains(PASSWORD));
    staged_as_published(&w, &files);
    let seen = mirror.seen();
    // Never asked to resolve a tag; every blob (the lists' and the images') came from it,
    // with ?ns=, its headers and the client certificate, and without the registry's
    // credentials (it asked for none).
    assert!(
        seen.iter().all(|s| !s.path.contains("/manifests/")),
        "{seen:?}"
    );
    // The exact request lines: one probe of /v2/ without `ns` (containerd sends none; see
    // the test below), then the blobs (both lists, both signatures, both images), each with
    // `ns` as containerd writes it.
    let lines: Vec<String> = seen
        .iter()
        .map(|s| format!("{} {}", s.method, s.path))
        .collect();
    assert_eq!(lines[0], "GET /v2/", "{lines:#?}");
    let mut blobs = lines[1..].to_vec();
    blobs.sort();
    let mut want = Vec::new();
    for (ext, image) in [
        ("kubernetes", "kubernetes-v1.32.3-x86-64.raw"),
        ("containerd", "containerd-1.7.24-x86-64.raw"),
    ] {
        for f in ["SHA256SUMS", "SHA256SUMS.gpg", image] {
            let hex = sha256(&std::fs::read(source.join(ext).join(f)).unwrap());
            want.push(format!("GET /v2/flatcar/{ext}/blobs/sha256:{hex}{ns}"));
        }
    }
    want.sort();
    assert_eq!(blobs, want, "{lines:#?}");
    for s in &seen {
        assert!(s.client_cert, "{}", s.path);
        assert!(s.header("authorization").is_none(), "{}", s.path);
        let fleet: Vec<_> = s
            .headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case("x-fleet"))
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(fleet, ["blue", "green"], "{}", s.path);
    }
    // The origin was asked for the lists' manifests only: not one blob.
    let log = origin.log();
    assert!(
        !log.contains("\"GET /v2/flatcar/kubernetes/blobs/"),
        "{log}"
    );
    assert!(
        !log.contains("\"GET /v2/flatcar/containerd/blobs/"),
        "{log}"
    );
    assert!(
        log.contains("\"GET /v2/flatcar/kubernetes/manifests/SHA256SUMS HTTP/1.1\" 200"),
        "{log}"
    );
}

#[test]
fn a_pull_through_cache_serves_the_second_node_without_asking_the_origin() {
    let ca = Ca::new("registry CA");
    // Open, as distribution 2.8's cache sends its credentials only to a token realm: the
    // fleet's nodes reach the origin through the cache alone.
    let origin = Registry::start(&ca, RegistryAuth::Open, None);
    let w = node_for(&ca);
    let (source, files) = signed_source(&w);
    origin.publish(&source, "flatcar", None, &w.ca_file);
    let cache = Registry::pull_through(&ca, &origin);
    let toml = format!("[host.\"https://{}\"]\n", cache.host());
    let k = sha256(&files[1].1);
    let origin_gets = |hex: &str| {
        origin
            .log()
            .lines()
            .filter(|l| {
                l.contains(&format!(
                    "\"GET /v2/flatcar/kubernetes/blobs/sha256:{hex} HTTP/"
                ))
            })
            .count()
    };
    let mut served = Vec::new();
    // Two nodes with the same hosts.toml and no credentials for the cache (it asks for none).
    for _ in 0..2 {
        let node = node_for(&ca);
        hosts_toml(&node, &origin, &toml, &[]);
        let url = format!("oci://{}/flatcar/${{NAME}}", origin.host());
        let r = run_from(&node, &url, &w.keyring);
        assert!(r.code == 0, "{}\n{}", r.stderr, cache.log());
        assert_eq!(
            std::fs::read(node.path("/opt/extensions/kubernetes/kubernetes-v1.32.3-x86-64.raw"))
                .unwrap(),
            files[1].1
        );
        served.push(origin_gets(&k));
    }
    assert!(
        cache.blob(&k).exists(),
        "the cache keeps what it pulled: {}",
        cache.log()
    );
    // The first node's pull reached the origin through the cache; the second one's did not.
    assert!(served[0] >= 1, "{}", origin.log());
    assert_eq!(served[1], served[0], "{}", origin.log());
}

#[test]
fn a_blob_cut_mid_body_is_resumed_with_range_from_the_registry() {
    let ca = Ca::new("registry CA");
    let reg = Registry::start(&ca, RegistryAuth::Open, None);
    let w = node_for(&ca);
    let (source, files) = signed_source_padded(&w, 3 << 20);
    reg.publish(&source, "flatcar", None, &w.ca_file);
    let (_, image) = files
        .iter()
        .find(|(n, _)| n == "containerd-1.7.24-x86-64.raw")
        .unwrap();
    let hex = sha256(image);
    // The node reaches the registry through a forwarder that breaks the first connection to
    // carry 1.5 MiB of answers: only the containerd blob is that large.
    let cutter = Cutter::start(reg.port, 3 << 19);
    let r = run_from(
        &w,
        &format!("oci://127.0.0.1:{}/flatcar/${{NAME}}", cutter.port),
        &w.keyring,
    );
    r.assert_ok();
    staged_as_published(&w, &files);
    assert_eq!(cutter.cuts.load(std::sync::atomic::Ordering::SeqCst), 1);
    // The second GET of the blob asked for the rest, and the registry (Go's ServeContent)
    // answered 206 with only that.
    let kept: u64 = r
        .stderr
        .split(&format!("/blobs/sha256:{hex}: resuming at byte "))
        .nth(1)
        .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no resume in the log:\n{}", r.stderr));
    assert!(kept > 1 << 20 && kept < 3 << 19, "kept {kept}");
    let log = reg.log();
    let gets: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(&format!("\"GET /v2/flatcar/containerd/blobs/sha256:{hex} ")))
        .collect();
    assert_eq!(gets.len(), 2, "{log}");
    let rest = image.len() as u64 - kept;
    assert!(
        gets[1].contains(&format!("\" 206 {rest} ")),
        "the second GET is not a 206 of {rest} bytes: {}",
        gets[1]
    );
}

/// Debian 13's containerd (the QEMU nodes' runtime; qemu/build-ddi-tools' root, which
/// tests/run.sh names in NODESTRAP_DDI_TOOLS) on sockets of its own, run by that root's loader:
/// the oracle of which hosts.toml a `config_path` of several folders names.
struct Containerd {
    child: std::process::Child,
    dir: PathBuf,
}

impl Containerd {
    fn start(config_path: &str) -> Containerd {
        let tree = super::signed::tools();
        let dir = unique_dir("containerd");
        let d = dir.display();
        std::fs::write(
            dir.join("config.toml"),
            format!(
                "version = 2\nroot = \"{d}/root\"\nstate = \"{d}/state\"\n\
                 [grpc]\n  address = \"{d}/c.sock\"\n[ttrpc]\n  address = \"{d}/c.sock.ttrpc\"\n\
                 [debug]\n  address = \"{d}/debug.sock\"\n\
                 [plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = \"{config_path}\"\n"
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("log")).unwrap();
        let child = Command::new(tree.join("lib64/ld-linux-x86-64.so.2"))
            .arg("--library-path")
            .arg(tree.join("lib/x86_64-linux-gnu"))
            .arg(tree.join("usr/bin/containerd"))
            .arg("--config")
            .arg(dir.join("config.toml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let c = Containerd { child, dir };
        for _ in 0..300 {
            if c.log().contains("containerd successfully booted") {
                return c;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!("containerd did not start:\n{}", c.log());
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    /// Asks its CRI plugin to pull `REPO/kube-apiserver` through a real CRI client (kubeadm
    /// from NODESTRAP_KUBE_BIN). The pull fails (nothing is published): who was asked is what
    /// counts.
    fn pull(&self, repo: &str) {
        let kube = support::cluster::kube_bin();
        let o = Command::new(kube.join("kubeadm"))
            .args(["config", "images", "pull", "--kubernetes-version=v1.37.2"])
            .arg(format!("--image-repository={repo}"))
            .arg(format!("--cri-socket=unix://{}/c.sock", self.dir.display()))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("failed to resolve reference"),
            "kubeadm's pull did not reach the resolver:\n{err}\n{}",
            self.log()
        );
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn a_config_path_of_several_folders_is_searched_as_the_real_containerd_searches_it() {
    let ca = Ca::new("mirrors CA");
    let mut w = node_for(&ca);
    let mirrors = [
        Server::start(&ca.server(), None),
        Server::start(&ca.server(), None),
    ];
    // Both answer the distribution API's probe: what each client sends past it is recorded.
    for m in &mirrors {
        m.set("/v2/", Reply::ok("{}"));
    }
    let port = dead_port();
    let registry = format!("127.0.0.1:{port}");
    let ns = format!("?ns=127.0.0.1%3A{port}");
    let underscored = format!("{}_", registry.replace(':', "_"));
    let folders = ["/etc/containerd/certs.d", "/etc/containerd/fleet.d"];
    let containerd = Containerd::start(&format!(
        "{}:{}",
        w.path(folders[0]).display(),
        w.path(folders[1]).display()
    ));
    w.extra.push(format!(
        "--registry-config-path={}:{}/",
        folders[0], folders[1]
    ));
    w.extra.push("--fetch-attempts=1".into());
    // (folder, host folder in it, the mirror its hosts.toml names; none: no hosts.toml).
    type Layout<'a> = &'a [(usize, &'a str, Option<usize>)];
    let cases: [(&str, Layout, [bool; 2]); 4] = [
        (
            "the second folder's HOST:PORT",
            &[(1, &registry, Some(1))],
            [false, true],
        ),
        (
            "the first folder's _default before the second's HOST:PORT",
            &[(0, "_default", Some(0)), (1, &registry, Some(1))],
            [true, false],
        ),
        (
            "the second folder's HOST_PORT_ before its own _default",
            &[(1, "_default", Some(0)), (1, &underscored, Some(1))],
            [false, true],
        ),
        (
            "the first folder's HOST:PORT without hosts.toml: the registry alone",
            &[(0, &registry, None), (1, &registry, Some(1))],
            [false, false],
        ),
    ];
    for (case, layout, expected) in cases {
        for f in folders {
            let _ = std::fs::remove_dir_all(w.path(f));
        }
        for (f, host, mirror) in layout {
            let dir = w.path(&format!("{}/{host}", folders[*f]));
            std::fs::create_dir_all(&dir).unwrap();
            if let Some(m) = mirror {
                std::fs::write(dir.join("ca.pem"), &ca.pem).unwrap();
                std::fs::write(
                    dir.join("hosts.toml"),
                    format!(
                        "[host.\"https://127.0.0.1:{}\"]\n  ca = \"ca.pem\"\n",
                        mirrors[*m].port
                    ),
                )
                .unwrap();
            }
        }
        let asked = |before: [usize; 2]| [0, 1].map(|i| mirrors[i].seen().len() > before[i]);
        let at_start = [0, 1].map(|i| mirrors[i].seen().len());
        containerd.pull(&format!("{registry}/flatcar"));
        let by_containerd = asked(at_start);
        let between = [0, 1].map(|i| mirrors[i].seen().len());
        let r = run_from(
            &w,
            &format!("oci://{registry}/flatcar/${{NAME}}"),
            &w.keyring,
        );
        let by_nodestrap = asked(between);
        assert_ne!(r.code, 0, "{case}: nothing is published\n{}", r.stderr);
        assert_eq!(
            by_containerd,
            expected,
            "{case}: containerd asked\n{}",
            containerd.log()
        );
        assert_eq!(
            by_nodestrap, by_containerd,
            "{case}: nodestrap asked\n{}",
            r.stderr
        );
        // The request lines the mirror asked got: containerd sends no probe, only its
        // resolve request, with `ns` (%3A for the colon, Go's url.Values.Encode); nodestrap
        // one `GET /v2/` without `ns`, then the same `ns` on its request for the list.
        if let Some(m) = expected.iter().position(|&a| a) {
            let seen = mirrors[m].seen();
            let lines = |from: usize, to: usize| -> Vec<String> {
                seen[from..to]
                    .iter()
                    .map(|s| format!("{} {}", s.method, s.path))
                    .collect()
            };
            let by_c = lines(at_start[m], between[m]);
            let resolve = format!("HEAD /v2/flatcar/kube-apiserver/manifests/v1.37.2{ns}");
            assert!(
                !by_c.is_empty() && by_c.iter().all(|l| *l == resolve),
                "{case}: containerd sent {by_c:#?}"
            );
            assert_eq!(
                lines(between[m], seen.len()),
                [
                    "GET /v2/".to_string(),
                    format!("GET /v2/flatcar/kubernetes/manifests/SHA256SUMS{ns}")
                ],
                "{case}: nodestrap's requests"
            );
        }
    }
    // An empty folder in the list is refused by name (containerd would search its own
    // working directory), as an option is: before anything is read.
    w.extra
        .retain(|a| !a.starts_with("--registry-config-path="));
    w.extra.push(format!(
        "--registry-config-path={}::{}",
        folders[0], folders[1]
    ));
    let r = run_from(
        &w,
        &format!("oci://{registry}/flatcar/${{NAME}}"),
        &w.keyring,
    );
    r.assert_fails(
        2,
        "folder 2 of its ':'-separated list, \"\", is not an absolute folder",
    );
    // Refused before anything is read from the node.
    assert!(!r.stderr.contains("os-release"), "{}", r.stderr);
}
