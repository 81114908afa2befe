//! Loop mounts by the kernel's ext4 driver, the probe that says whether they work here, and
//! [`require_kernel!`](crate::require_kernel).

use crate::image::Image;
use crate::tools::{find_tool, is_root, out_text, run, tool};
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// Says which test skips what, and why: the test's name where the harness runs it on a thread
/// of that name, else the module and line of the skip. For the `require_*!` macros.
#[doc(hidden)]
pub fn skip_note(module: &str, line: u32, what: &str, why: &str) {
    let thread = std::thread::current();
    match thread.name().filter(|n| *n != "main") {
        Some(test) => eprintln!("SKIP {test}: {what} ({why})"),
        None => eprintln!("SKIP {module} (line {line}): {what} ({why})"),
    }
}

/// Whether `REXT4_REQUIRE_MOUNT=1` asks for the mount comparisons to run (and fail rather
/// than skip where they cannot).
pub(crate) fn mounts_required() -> bool {
    std::env::var_os("REXT4_REQUIRE_MOUNT").is_some_and(|v| v == "1")
}

/// A loop mount of an image by the kernel's ext4 driver; unmounted on drop (also when a test
/// panics while it is mounted).
pub struct KernelMount {
    dir: Option<tempfile::TempDir>,
    mounted: bool,
}

impl KernelMount {
    /// Mounts `img` read-only. Fails at once where the kernel cannot mount images (see
    /// [`why_no_kernel_mount`], which panics under `REXT4_REQUIRE_MOUNT=1`).
    pub fn ro(img: &Path) -> Result<KernelMount, String> {
        Self::mount(img, "loop,ro")
    }
    /// Mounts `img` read-write, like [`KernelMount::ro`].
    pub fn rw(img: &Path) -> Result<KernelMount, String> {
        Self::mount(img, "loop")
    }
    /// Mounts `img` with mount(8)'s `-o opts` (`loop` among them), like [`KernelMount::ro`].
    pub fn with_options(img: &Path, opts: &str) -> Result<KernelMount, String> {
        Self::mount(img, opts)
    }
    fn mount(img: &Path, opts: &str) -> Result<KernelMount, String> {
        if let Some(why) = why_no_kernel_mount() {
            return Err(format!("the kernel cannot mount images here: {why}"));
        }
        Self::mount_unprobed(img, opts)
    }
    /// The mount itself (the probe's own mount must not wait for the probe).
    fn mount_unprobed(img: &Path, opts: &str) -> Result<KernelMount, String> {
        let dir = tempfile::Builder::new().prefix("rext4-mnt").tempdir().map_err(|e| e.to_string())?;
        let mut last = String::new();
        // Parallel tests race for free loop devices; mount(8) usually retries, but be sure.
        for _ in 0..3 {
            let o =
                run(Command::new(tool("mount")).args(["-t", "ext4", "-o", opts]).arg(img).arg(dir.path()));
            if o.status.success() {
                return Ok(KernelMount { dir: Some(dir), mounted: true });
            }
            last = out_text(&o);
            if last.contains("permission denied") || last.contains("must be superuser") {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Err(format!("mount -o {opts} {} failed: {last}", img.display()))
    }
    /// The mount point.
    pub fn path(&self) -> &Path {
        match &self.dir {
            Some(d) => d.path(),
            None => Path::new("/nonexistent"),
        }
    }
    /// Unmounts, reporting failure.
    pub fn unmount(mut self) -> Result<(), String> {
        self.umount_inner()
    }
    fn umount_inner(&mut self) -> Result<(), String> {
        if !self.mounted {
            return Ok(());
        }
        let p = self.path().to_path_buf();
        let mut last = String::new();
        for _ in 0..20 {
            let o = run(Command::new(tool("umount")).arg(&p));
            if o.status.success() {
                self.mounted = false;
                return Ok(());
            }
            last = out_text(&o);
            std::thread::sleep(Duration::from_millis(100));
        }
        // Never let the TempDir's cleanup walk into a still-mounted filesystem.
        let _ = Command::new(tool("umount")).arg("-l").arg(&p).status();
        if let Some(d) = self.dir.take() {
            let _ = d.keep();
        }
        self.mounted = false;
        Err(format!("umount {} failed: {last}", p.display()))
    }
}

impl Drop for KernelMount {
    fn drop(&mut self) {
        if let Err(e) = self.umount_inner() {
            eprintln!("warning: {e}");
        }
    }
}

/// Why this process cannot loop-mount images (not root, no mount(8), no loop devices or no
/// ext4 driver), or None when it can. Probed once, by mounting a fresh image. With
/// `REXT4_REQUIRE_MOUNT=1` a failed probe panics: the run asked for the kernel comparisons.
pub fn why_no_kernel_mount() -> Option<&'static str> {
    static CAN: OnceLock<Result<(), String>> = OnceLock::new();
    let r = CAN.get_or_init(|| {
        if !is_root() {
            return Err("not running as root".into());
        }
        if find_tool("mount").is_none() || find_tool("umount").is_none() {
            return Err("mount(8) / umount(8) not found".into());
        }
        let d = tempfile::tempdir().map_err(|e| e.to_string())?;
        let img = d.path().join("probe.img");
        Image::ext4("8M").build(&img);
        let m = KernelMount::mount_unprobed(&img, "loop,ro")?;
        m.unmount()
    });
    match r {
        Ok(()) => None,
        Err(why) if mounts_required() => {
            panic!("REXT4_REQUIRE_MOUNT=1 but the kernel cannot mount images here: {why}")
        }
        Err(why) => Some(why),
    }
}

/// Whether this process can loop-mount images, for tests that compare with the kernel when
/// they can and go on without it otherwise; says so when it cannot. Panics under
/// `REXT4_REQUIRE_MOUNT=1` where it cannot (see [`why_no_kernel_mount`]).
pub fn kernel_can_mount() -> bool {
    match why_no_kernel_mount() {
        None => true,
        Some(why) => {
            eprintln!("SKIP kernel comparison: cannot loop-mount images here ({why})");
            false
        }
    }
}

/// What the `require_*!` macros share: when `$why` (an `Option` of why not) says so, notes the
/// skip (`$what`) and returns `$ret` from the caller.
#[doc(hidden)]
#[macro_export]
macro_rules! skip_unless {
    ($why:expr, $what:expr, $ret:expr) => {
        if let Some(why) = $why {
            $crate::skip_note(module_path!(), line!(), $what, &why);
            return $ret;
        }
    };
}

/// Returns from the calling test (or helper) when the kernel cannot loop-mount images here,
/// printing why; panics instead under `REXT4_REQUIRE_MOUNT=1`. `require_kernel!(value)`
/// returns `value` from a function that does not return `()`.
#[macro_export]
macro_rules! require_kernel {
    () => {
        $crate::require_kernel!(())
    };
    ($ret:expr) => {
        $crate::skip_unless!($crate::why_no_kernel_mount(), "cannot loop-mount images here", $ret)
    };
}
