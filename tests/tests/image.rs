//! The image users run, as the tests build it: `cargo xtask image` writes it as an OCI
//! archive (`cargo xtask test` builds it first, with the dev profile, and names it in
//! `EVICTD_IMAGE`). Read here as an OCI image layout (every digest and size checked), its
//! binary run alone in an empty root — no loader, no library, nothing but the binary — and
//! the archive imported into a real containerd, which must name it as the DaemonSet does.

use std::{collections::HashMap, io::Read as _, path::PathBuf, process::Command};

use evictd_tests::{containerd::Containerd, privileged, skip};
use serde_json::Value;
use sha2::Digest as _;

const TEST: &str = "the_image_is_the_static_binary_alone_and_containerd_takes_it";

/// The archive `cargo xtask image` wrote, or why there is none.
fn archive() -> Result<PathBuf, String> {
    let path = std::env::var_os("EVICTD_IMAGE").ok_or(
        "EVICTD_IMAGE is not set: run `cargo xtask image`, then this test with EVICTD_IMAGE=<archive>",
    )?;
    Ok(PathBuf::from(path))
}

/// The files of a tar, by path.
fn untar(bytes: &[u8]) -> HashMap<String, (Vec<u8>, u32)> {
    let mut files = HashMap::new();
    let mut tar = tar::Archive::new(bytes);
    for entry in tar.entries().expect("a tar") {
        let mut entry = entry.expect("a tar entry");
        let path = entry.path().expect("a path").display().to_string();
        let mode = entry.header().mode().expect("a mode");
        let mut data = Vec::new();
        entry.read_to_end(&mut data).expect("reading a tar entry");
        files.insert(path, (data, mode));
    }
    files
}

/// The blob a descriptor names, its digest and size checked.
fn blob<'a>(files: &'a HashMap<String, (Vec<u8>, u32)>, descriptor: &Value) -> &'a [u8] {
    let digest = descriptor["digest"].as_str().expect("a digest");
    let hex = digest.strip_prefix("sha256:").expect("sha256");
    let (data, _) = files.get(&format!("blobs/sha256/{hex}")).unwrap_or_else(|| panic!("no blob {digest}"));
    assert_eq!(format!("{:x}", sha2::Sha256::digest(data)), hex, "blob {digest} has another digest");
    assert_eq!(descriptor["size"].as_u64(), Some(data.len() as u64), "blob {digest} size");
    data
}

#[test]
fn the_image_is_the_static_binary_alone_and_containerd_takes_it() {
    let path = match archive() {
        Ok(p) => p,
        Err(why) => return skip(TEST, &why),
    };
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let files = untar(&bytes);
    let json = |name: &str| -> Value { serde_json::from_slice(&files[name].0).expect(name) };
    assert_eq!(json("oci-layout")["imageLayoutVersion"], "1.0.0");
    let index = json("index.json");
    let manifests = index["manifests"].as_array().expect("manifests");
    assert_eq!(manifests.len(), 1, "{index}");
    let name = manifests[0]["annotations"]["io.containerd.image.name"].as_str().expect("the image's name");
    let manifest: Value = serde_json::from_slice(blob(&files, &manifests[0])).expect("the manifest");
    let config: Value = serde_json::from_slice(blob(&files, &manifest["config"])).expect("the config");
    assert_eq!(config["config"]["Entrypoint"], serde_json::json!(["/usr/local/bin/evictd"]));
    let env = config["config"]["Env"].as_array().expect("Env");
    let path_var = env.iter().filter_map(Value::as_str).find_map(|e| e.strip_prefix("PATH=")).expect("PATH");
    assert!(path_var.split(':').any(|d| d == "/usr/local/bin"), "`evictd` found by name: {path_var}");
    assert_eq!((config["os"].as_str(), config["architecture"].as_str()), (Some("linux"), Some("amd64")));
    let layers = manifest["layers"].as_array().expect("layers");
    assert_eq!(layers.len(), 1, "one layer: {manifest}");
    let mut tar = Vec::new();
    flate2::read::GzDecoder::new(blob(&files, &layers[0])).read_to_end(&mut tar).expect("a gzip layer");
    assert_eq!(
        config["rootfs"]["diff_ids"][0].as_str(),
        Some(format!("sha256:{:x}", sha2::Sha256::digest(&tar)).as_str()),
        "the config names the layer's uncompressed digest"
    );
    let layer = untar(&tar);
    let mut paths: Vec<&String> = layer.keys().collect();
    paths.sort();
    assert_eq!(paths, ["usr/", "usr/local/", "usr/local/bin/", "usr/local/bin/evictd"], "the binary alone");
    let (binary, mode) = &layer["usr/local/bin/evictd"];
    assert_eq!(mode & 0o777, 0o755);

    // Alone in an empty root: a dynamically linked binary finds no loader there.
    if !privileged(TEST) {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let exe = root.path().join("evictd");
    std::fs::write(&exe, binary).unwrap();
    std::fs::set_permissions(&exe, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out =
        Command::new("chroot").arg(root.path()).args(["/evictd", "--version"]).output().expect("chroot");
    assert!(out.status.success(), "evictd alone in an empty root: {out:?}");
    let version = String::from_utf8_lossy(&out.stdout);
    assert!(version.starts_with("evictd "), "{version}");
    let out = Command::new("chroot")
        .arg(root.path())
        .args(["/evictd", "check-config", "--eviction-hard", "memory.available<1Gi", "--output", "json"])
        .output()
        .expect("chroot");
    assert!(out.status.success(), "check-config alone in an empty root: {out:?}");

    // A real containerd takes the archive and names the image as the DaemonSet does.
    if !evictd_tests::containerd::available(TEST) {
        return;
    }
    let ctd = Containerd::start(1 << 30);
    let out = ctd.ctr(&["images", "import", &path.display().to_string()]);
    assert!(out.status.success(), "ctr images import: {}", String::from_utf8_lossy(&out.stderr));
    let out = ctd.ctr(&["images", "ls", "-q"]);
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(listed.lines().any(|l| l == name), "{name} not in {listed}");
    let ds =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/daemonset.yaml"))
            .unwrap();
    assert!(ds.contains(&format!("image: {name}")), "deploy/daemonset.yaml runs {name}");
}
