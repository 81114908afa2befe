//! A second kernel as oracle: Debian's packaged Linux booted under QEMU, for what the host's
//! kernel cannot show (this one is built without `CONFIG_UNICODE`, so it has no casefolded
//! directories). The VM runs one shell script over the images given as virtio disks
//! (`/dev/vda`, `/dev/vdb`, ...) and returns what the script printed.
//!
//! What it takes (`.ci/setup` installs it): `qemu-system-x86_64`, a static busybox
//! (`busybox-static`), a C compiler with static libc (for `vm/vmtool.c`, the fscrypt and flag
//! ioctls), and a Linux image package unpacked in `$REXT4_VM_KERNEL` (default
//! `/var/cache/rext4-vm`): `boot/vmlinuz-*` and `lib/modules/*/kernel/**.ko`. The VM boots
//! with QEMU's emulator (TCG): KVM is not always usable where the tests run (nested), and a
//! boot takes some seconds either way.
//!
//! Tests start with [`require_vm!`](crate::require_vm): without the VM they return saying why,
//! and under `REXT4_REQUIRE_MOUNT=1` they fail.

use crate::tools::{find_tool, out_text, run};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The modules ext4, its checksums, virtio disks and fscrypt's modes need, in load order. A
/// module the kernel has built in (no `.ko`) is skipped.
const MODULES: &[&str] = &[
    "crc16",
    "mbcache",
    "jbd2",
    "crc32c_generic",
    "libcrc32c",
    "ext4",
    "virtio_ring",
    "virtio",
    "virtio_pci_modern_dev",
    "virtio_pci_legacy_dev",
    "virtio_pci",
    "virtio_blk",
    "ecb",
    "xts",
    "cts",
    "sha512_generic",
];

/// What a script run printed (standard output and error, in order) and its exit status.
pub struct VmRun {
    pub out: String,
    pub status: i32,
}

impl VmRun {
    /// Panics with the output unless the script exited 0; returns the output.
    pub fn ok(self) -> String {
        assert_eq!(self.status, 0, "the VM's script failed:\n{}", self.out);
        self.out
    }
}

struct Parts {
    kernel: PathBuf,
    /// The initramfs's fixed part (busybox, vmtool, modules), without its trailer.
    base: Vec<u8>,
    qemu: PathBuf,
    modules: Vec<String>,
}

fn parts() -> &'static Result<Parts, String> {
    static PARTS: OnceLock<Result<Parts, String>> = OnceLock::new();
    PARTS.get_or_init(build_parts)
}

fn build_parts() -> Result<Parts, String> {
    let qemu =
        find_tool("qemu-system-x86_64").ok_or("qemu-system-x86_64 not found (package qemu-system-x86)")?;
    let root = std::env::var_os("REXT4_VM_KERNEL")
        .map_or_else(|| PathBuf::from("/var/cache/rext4-vm"), PathBuf::from);
    let kernel = std::fs::read_dir(root.join("boot"))
        .map_err(|e| format!("no kernel in {}/boot ({e}; .ci/setup unpacks one)", root.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-")))
        .ok_or_else(|| format!("no vmlinuz-* in {}/boot", root.display()))?;
    let moddir = std::fs::read_dir(root.join("lib/modules"))
        .map_err(|e| format!("{}/lib/modules: {e}", root.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.join("kernel").is_dir())
        .ok_or_else(|| format!("no lib/modules/*/kernel in {}", root.display()))?;
    let mut found = Vec::new();
    find_modules(&moddir.join("kernel"), &mut found);
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or("busybox not found (package busybox-static)")?;
    let bb = std::fs::read(&busybox).map_err(|e| format!("{}: {e}", busybox.display()))?;
    if has_interpreter(&bb) {
        return Err(format!("{} is linked dynamically (install busybox-static)", busybox.display()));
    }
    let vmtool = compile_vmtool()?;

    let mut cpio = Cpio::default();
    for d in ["bin", "dev", "proc", "sys", "mnt", "tmp", "lib"] {
        cpio.dir(d);
    }
    cpio.file("bin/busybox", 0o755, &bb);
    cpio.symlink("bin/sh", "busybox");
    cpio.file("bin/vmtool", 0o755, &vmtool);
    let mut modules = Vec::new();
    for m in MODULES {
        if let Some(p) = found.iter().find(|p| p.file_name().is_some_and(|n| n == format!("{m}.ko").as_str()))
        {
            let bytes = std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?;
            cpio.file(&format!("lib/{m}.ko"), 0o644, &bytes);
            modules.push((*m).to_string());
        }
    }
    if !modules.iter().any(|m| m == "ext4") {
        return Err(format!("no ext4.ko under {}", moddir.display()));
    }
    Ok(Parts { kernel, base: cpio.buf, qemu, modules })
}

/// Whether the ELF executable `elf` names a program interpreter (is linked dynamically): a
/// `PT_INTERP` program header.
fn has_interpreter(elf: &[u8]) -> bool {
    let word = |at: usize, n: usize| -> usize {
        elf.get(at..at + n).map_or(0, |b| b.iter().rev().fold(0, |v, &x| (v << 8) | usize::from(x)))
    };
    let (phoff, phentsize, phnum) = (word(0x20, 8), word(0x36, 2), word(0x38, 2));
    (0..phnum).any(|i| word(phoff + i * phentsize, 4) == 3)
}

fn find_modules(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.filter_map(Result::ok) {
        let p = e.path();
        if p.is_dir() {
            find_modules(&p, out);
        } else if p.extension().is_some_and(|x| x == "ko") {
            out.push(p);
        }
    }
}

fn compile_vmtool() -> Result<Vec<u8>, String> {
    let cc = find_tool("cc").ok_or("no C compiler (cc) for vm/vmtool.c")?;
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("vm/vmtool.c");
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let bin = dir.path().join("vmtool");
    let o = run(Command::new(cc).args(["-static", "-O2", "-o"]).arg(&bin).arg(&src));
    if !o.status.success() {
        return Err(format!("cc -static vm/vmtool.c: {}", out_text(&o)));
    }
    std::fs::read(&bin).map_err(|e| e.to_string())
}

/// Why the VM oracle cannot run here, or None when it can (probed once by booting it).
/// Panics under `REXT4_REQUIRE_MOUNT=1` where it cannot: the run asked for the comparisons.
pub fn why_no_vm() -> Option<&'static str> {
    static PROBE: OnceLock<Result<(), String>> = OnceLock::new();
    let r = PROBE.get_or_init(|| {
        parts().as_ref().map_err(Clone::clone)?;
        let r = try_run("cat /sys/fs/ext4/features/casefold /sys/fs/ext4/features/encryption", &[], &[])?;
        if r.status != 0 || r.out.matches("supported").count() != 2 {
            return Err(format!("the VM's ext4 lacks casefolding or encryption:\n{}", r.out));
        }
        Ok(())
    });
    match r {
        Ok(()) => None,
        Err(why) if crate::kernel::mounts_required() => {
            panic!("REXT4_REQUIRE_MOUNT=1 but the VM oracle cannot run here: {why}")
        }
        Err(why) => Some(why),
    }
}

/// Returns from the calling test when the VM oracle cannot run here, printing why; panics
/// instead under `REXT4_REQUIRE_MOUNT=1`.
#[macro_export]
macro_rules! require_vm {
    () => {
        $crate::skip_unless!($crate::why_no_vm(), "no VM oracle", ())
    };
}

/// Boots the VM with `disks` as `/dev/vda`, `/dev/vdb`, ... and `files` (path under `/`,
/// bytes) in its root, runs `script` with busybox's `sh` (busybox's applets and `vmtool` on
/// `PATH`, modules loaded) and returns what it printed. Panics if the VM cannot run.
pub fn vm_run(script: &str, disks: &[&Path], files: &[(&str, &[u8])]) -> VmRun {
    try_run(script, disks, files).unwrap_or_else(|e| panic!("VM: {e}"))
}

fn try_run(script: &str, disks: &[&Path], files: &[(&str, &[u8])]) -> Result<VmRun, String> {
    let parts = parts().as_ref().map_err(Clone::clone)?;
    let mut cpio = Cpio { buf: parts.base.clone(), ino: 1_000 };
    // The script's output goes to the second serial port, the kernel's messages to the first.
    let init = format!(
        "#!/bin/busybox sh\n/bin/busybox --install -s /bin\nexport PATH=/bin\n\
         mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev\n\
         for m in {}; do insmod /lib/$m.ko || echo \"insmod $m failed\"; done\n\
         for i in $(seq 50); do [ -e /dev/vda ] || [ {} = 0 ] && break; sleep 0.1; done\n\
         exec >/dev/ttyS1 2>&1\ncd /tmp\nsh -e /script\necho \"VM-EXIT $?\"\nsync\npoweroff -f\n",
        parts.modules.join(" "),
        disks.len()
    );
    cpio.file("init", 0o755, init.as_bytes());
    cpio.file("script", 0o644, script.as_bytes());
    for (path, bytes) in files {
        cpio.file(path.trim_start_matches('/'), 0o600, bytes);
    }
    cpio.trailer();
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let initrd = dir.path().join("initrd");
    std::fs::write(&initrd, &cpio.buf).map_err(|e| e.to_string())?;
    let (console, out) = (dir.path().join("console"), dir.path().join("out"));
    let mut cmd = Command::new(&parts.qemu);
    cmd.args(["-accel", "tcg", "-m", "768", "-display", "none", "-monitor", "none", "-no-reboot"])
        .arg("-kernel")
        .arg(&parts.kernel)
        .arg("-initrd")
        .arg(&initrd)
        .args(["-append", "console=ttyS0 panic=-1 loglevel=4"])
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .arg("-serial")
        .arg(format!("file:{}", out.display()));
    for d in disks {
        cmd.arg("-drive").arg(format!("file={},format=raw,if=virtio,cache=unsafe", d.display()));
    }
    // QEMU's own complaints go to a file (a pipe nobody reads could fill and stall it).
    let errors = dir.path().join("qemu-stderr");
    let err_file = std::fs::File::create(&errors).map_err(|e| e.to_string())?;
    let mut child =
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(err_file).spawn().map_err(|e| e.to_string())?;
    let start = Instant::now();
    let limit = Duration::from_secs(600);
    loop {
        if child.try_wait().map_err(|e| e.to_string())?.is_some() {
            break;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            let con = std::fs::read_to_string(&console).unwrap_or_default();
            return Err(format!("no end after {limit:?}; console:\n{con}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let text = std::fs::read_to_string(&out).unwrap_or_default().replace("\r\n", "\n");
    let Some(at) = text.rfind("VM-EXIT ") else {
        let con = std::fs::read_to_string(&console).unwrap_or_default();
        let qemu = std::fs::read_to_string(&errors).unwrap_or_default();
        return Err(format!(
            "the script did not finish; its output:\n{text}\nconsole:\n{con}\nqemu:\n{qemu}"
        ));
    };
    let status = text[at + 8..].trim().parse().map_err(|_| format!("bad exit line in:\n{text}"))?;
    Ok(VmRun { out: text[..at].to_string(), status })
}

/// An initramfs in the `newc` cpio format, built in memory.
#[derive(Default)]
struct Cpio {
    buf: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.ino += 1;
        let fields = [self.ino, mode, 0, 0, 1, 0, data.len() as u32, 0, 0, 0, 0, name.len() as u32 + 1, 0];
        let mut head = String::from("070701");
        for f in fields {
            head.push_str(&format!("{f:08X}"));
        }
        self.buf.extend_from_slice(head.as_bytes());
        self.buf.extend_from_slice(name.as_bytes());
        self.buf.push(0);
        self.pad();
        self.buf.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }

    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040_755, &[]);
    }

    fn file(&mut self, name: &str, perm: u32, data: &[u8]) {
        self.entry(name, 0o100_000 | perm, data);
    }

    fn symlink(&mut self, name: &str, target: &str) {
        self.entry(name, 0o120_777, target.as_bytes());
    }

    fn trailer(&mut self) {
        self.entry("TRAILER!!!", 0, &[]);
    }
}
