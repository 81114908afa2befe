//! `rext4 stats MOUNTPOINT`: the engine's statistics for a filesystem served by `rext4 mount`,
//! as tables or JSON (`rext4_cli::stats`).
//!
//! The daemon answers on a Unix socket in a runtime directory (`/run/rext4` for root, else
//! `$XDG_RUNTIME_DIR/rext4` or `/tmp/rext4-UID`), named after the mount's device number as
//! `/proc/self/mountinfo` shows it, so the command finds it from the mount point alone without
//! a request through the mount itself. A request is one line, `stats` or `reset`, followed by
//! ` json` for JSON; the daemon writes the report (`rext4_cli::stats`) and closes the
//! connection.

use crate::CliResult;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where daemons put their statistics sockets.
fn runtime_dir() -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/run/rext4");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("rext4"),
        _ => std::env::temp_dir().join(format!("rext4-{}", nix::unistd::geteuid())),
    }
}

/// The device number (`major:minor`) of what is mounted at `dir`, from mountinfo.
fn mount_dev(dir: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let d = dir.to_string_lossy();
    // The last mount on a directory is the visible one.
    info.lines()
        .rfind(|l| l.split(' ').nth(4) == Some(&*d))
        .and_then(|l| l.split(' ').nth(2))
        .map(str::to_string)
}

fn socket_path(dev: &str) -> PathBuf {
    runtime_dir().join(format!("stats-{}.sock", dev.replace(':', "_")))
}

/// Serves statistics for `fs`, mounted at `mountpoint`, on a background thread; returns the
/// socket's path (removed by the caller when the daemon ends). Called by the daemon once the
/// mount exists.
pub(crate) fn serve(fs: rext4::Fs, mountpoint: &Path) -> CliResult<PathBuf> {
    let dev = mount_dev(mountpoint).ok_or_else(|| format!("{}: not in mountinfo", mountpoint.display()))?;
    let path = socket_path(&dev);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    }
    // A socket left by a daemon that died with the same device number.
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    std::thread::Builder::new()
        .name("rext4-stats".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
                let mut line = String::new();
                let _ = BufReader::new(&conn).read_line(&mut line);
                let report = fs.stats();
                let mut words = line.split_whitespace();
                if words.next() == Some("reset") {
                    fs.reset_stats();
                }
                let text = match words.next() {
                    Some("json") => rext4_cli::stats::json(&report) + "\n",
                    _ => rext4_cli::stats::tables(&report),
                };
                let _ = conn.write_all(text.as_bytes());
            }
        })
        .map_err(|e| format!("cannot start the statistics thread: {e}"))?;
    Ok(path)
}

/// Asks the daemon serving `mountpoint` for its report, as tables or JSON (and to reset it,
/// after reporting).
pub(crate) fn fetch(mountpoint: &Path, json: bool, reset: bool) -> CliResult<String> {
    let dir = mountpoint.canonicalize().map_err(|e| format!("{}: {e}", mountpoint.display()))?;
    let dev = mount_dev(&dir).ok_or_else(|| format!("{}: not a mount point", dir.display()))?;
    let path = socket_path(&dev);
    let mut conn = UnixStream::connect(&path).map_err(|e| {
        format!("{}: no rext4 daemon serves this mount ({}: {e})", dir.display(), path.display())
    })?;
    conn.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
    let request = format!("{}{}", if reset { "reset" } else { "stats" }, if json { " json" } else { "" });
    writeln!(conn, "{request}").map_err(|e| e.to_string())?;
    let mut report = String::new();
    conn.read_to_string(&mut report).map_err(|e| format!("reading the report: {e}"))?;
    if report.is_empty() {
        return Err("the daemon sent no report".into());
    }
    Ok(report)
}

/// `rext4 stats MOUNTPOINT [--json] [--reset]`.
pub(crate) fn run(mountpoint: &Path, json: bool, reset: bool) -> CliResult {
    print!("{}", fetch(mountpoint, json, reset)?);
    Ok(())
}
