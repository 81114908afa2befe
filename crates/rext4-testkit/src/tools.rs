//! Finding and running the e2fsprogs / util-linux tools the oracles use.

use std::path::PathBuf;
use std::process::{Command, Output};

/// Finds a tool on `PATH` or in the sbin directories.
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    dirs.extend(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from));
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

/// Finds an e2fsprogs / util-linux tool; these tests cannot run without it.
pub fn tool(name: &str) -> PathBuf {
    find_tool(name)
        .unwrap_or_else(|| panic!("{name} is required for these tests (install e2fsprogs / util-linux)"))
}

/// Runs `cmd` to completion; panics if it cannot be started.
pub(crate) fn run(cmd: &mut Command) -> Output {
    match cmd.output() {
        Ok(o) => o,
        Err(e) => panic!("cannot run {cmd:?}: {e}"),
    }
}

/// A finished command's exit status and output, for failure messages.
pub(crate) fn out_text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs `cmds` (one debugfs command a line) on `img` with `debugfs -w`, from a script file
/// beside it; panics unless debugfs succeeds.
pub fn debugfs_write(img: &std::path::Path, cmds: &str) {
    let script = img.with_extension("debugfs");
    std::fs::write(&script, cmds).unwrap_or_else(|e| panic!("{}: {e}", script.display()));
    let out = run(Command::new(tool("debugfs")).arg("-w").arg("-f").arg(&script).arg(img));
    assert!(out.status.success(), "debugfs -w -f {}: {}", script.display(), out_text(&out));
}

/// Whether this process runs as root (owners, devices and trusted xattrs need it).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}
