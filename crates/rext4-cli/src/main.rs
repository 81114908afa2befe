//! `rext4`: read, inspect and copy out of ext4 images without mounting them.
// One function may use `unsafe`: the ioctl of `key_cmd.rs`.
#![deny(unsafe_code)]

mod cp;
mod cp_in;
mod demo;
mod export_safe;
mod file_contexts;
mod fmt;
mod imagepath;
mod inspect;
mod key_cmd;
mod mkfs_cmd;
mod mkfs_fit;
mod mkfs_from;
mod mkfs_tar;
mod modify;
mod mount_cmd;
mod mount_helper;
mod quota_cmd;
mod stats_cmd;
mod xattr_cmd;

use clap::{Parser, Subcommand};
pub(crate) use rext4_cli::{rng, CliResult};

// glibc's malloc locks an arena when a thread frees memory another thread allocated, which
// the engine does all the time (journal copies, cache entries): on two cores that put worker
// threads to sleep. mimalloc frees across threads without a lock. Built without its
// transparent-huge-page advice (`no_thp`): memory it returned to the system came back as 2 MiB
// pages zeroed whole on first touch, at times a large share of the CPU (docs/bench.md, "After
// commit-time leaf checksums, and mimalloc without huge pages").
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "rext4", version, about = "ext4 in userspace: work with ext4 images without mounting them")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// The journal device of an image whose journal is on one of its own (`mkfs.ext4 -J
    /// device=`): needed to change such an image, or to read it when its journal needs
    /// recovery (the kernel's `journal_path=`; for `mount`, the same as `-o journal_path=`).
    #[arg(long = "journal", id = "journal_device", global = true, value_name = "PATH")]
    journal_device: Option<PathBuf>,
    /// A master key of encrypted directories, as raw bytes in FILE (what `fscryptctl add_key`
    /// reads), for v2 policies; may be given more than once (for `mount`, `-o key=FILE`).
    #[arg(long = "key", global = true, value_name = "FILE")]
    keys: Vec<String>,
    /// A master key for v1 policies, named by its 16-hex-digit descriptor (`-o key_v1=`).
    #[arg(long = "key-v1", global = true, value_name = "DESCRIPTOR:FILE")]
    v1_keys: Vec<String>,
}

#[derive(Subcommand)]
enum KeyCmd {
    /// Add the keys given with --key FILE / --key-v1 DESCRIPTOR:FILE (or a v2 key's raw bytes
    /// on standard input) to the mount holding PATH; prints each key's identifier (v2) or
    /// descriptor (v1).
    Add {
        /// Print nothing.
        #[arg(short = 'q')]
        quiet: bool,
        path: PathBuf,
    },
    /// Remove your claim to key ID (32 hex digits; a v1 descriptor, 16, as root) from the
    /// mount holding PATH; with --all-users (root) the key itself.
    Remove {
        #[arg(long)]
        all_users: bool,
        path: PathBuf,
        id: String,
    },
    /// Whether key ID is present on the mount holding PATH, and who added it.
    Status { path: PathBuf, id: String },
    /// The encryption policy of PATH, a file or directory on a rext4 mount.
    Policy { path: PathBuf },
}

#[derive(Subcommand)]
enum Cmd {
    /// Build a demo image with mkfs.ext4, read it back with rext4 and check every file, then
    /// change it through the journal and check it with e2fsck.
    Demo {
        /// Keep the image and its source tree in this directory instead of a temporary one.
        #[arg(long)]
        keep: Option<PathBuf>,
        /// Number of files in the demo tree.
        #[arg(long, default_value_t = 20000)]
        files: usize,
    },
    /// Make a filesystem: `rext4 mkfs [-t ext4] [-b BS] [-O FEATURES] ... IMAGE [SIZE]`, with
    /// mke2fs's options and e2fsprogs 1.47's defaults.
    Mkfs(Box<mkfs_cmd::MkfsArgs>),
    /// Print the superblock summary (like `dumpe2fs -h`).
    Info { image: PathBuf },
    /// Show quota usage, limits and grace times (like `repquota`): user quotas, or those -u,
    /// -g and -P pick. Ids are numeric.
    Repquota {
        #[arg(short = 'u')]
        user: bool,
        #[arg(short = 'g')]
        group: bool,
        #[arg(short = 'P')]
        project: bool,
        image: PathBuf,
    },
    /// Set quota limits (like `setquota`): `rext4 setquota -u|-g|-P ID BLOCK-SOFT BLOCK-HARD
    /// INODE-SOFT INODE-HARD IMAGE`. Block limits in KiB, or with a K, M, G or T suffix; 0 is
    /// no limit. Grace periods: `rext4 setquota -t -u|-g|-P BLOCK-GRACE INODE-GRACE IMAGE`, in
    /// seconds or with an s, m, h or d suffix. Enforced where the image is mounted with
    /// usrquota/grpquota/prjquota (by `rext4 mount` or the kernel).
    Setquota {
        #[arg(short = 'u', conflicts_with_all = ["group", "project"])]
        user: bool,
        #[arg(short = 'g', conflicts_with = "project")]
        group: bool,
        #[arg(short = 'P')]
        project: bool,
        /// Set the grace periods instead of an id's limits.
        #[arg(short = 't')]
        times: bool,
        /// ID BLOCK-SOFT BLOCK-HARD INODE-SOFT INODE-HARD IMAGE, or with -t BLOCK-GRACE
        /// INODE-GRACE IMAGE.
        #[arg(required = true, num_args = 3..=6)]
        args: Vec<String>,
    },
    /// List a directory: `rext4 ls [-l] IMAGE:/dir`.
    Ls {
        /// Long format: mode, links, owner, size, time.
        #[arg(short = 'l')]
        long: bool,
        /// Include entries starting with a dot.
        #[arg(short = 'a')]
        all: bool,
        target: String,
    },
    /// Write a file's content to standard output: `rext4 cat IMAGE:/file`.
    Cat { target: String },
    /// Show an inode's attributes: `rext4 stat IMAGE:/path`.
    Stat { target: String },
    /// Show a directory tree: `rext4 tree IMAGE:/dir`.
    Tree { target: String },
    /// Change permission bits: `rext4 chmod 0644 IMAGE:/path`.
    Chmod { mode: String, target: String },
    /// Change owner and group (numeric): `rext4 chown 1000:1000 IMAGE:/path`.
    Chown { owner: String, target: String },
    /// Set access and modification times of an existing file: `rext4 touch [-d SECS[.NANOS]] IMAGE:/path`.
    Touch {
        /// The time, in seconds since the epoch (default: now).
        #[arg(short = 'd', long)]
        date: Option<String>,
        target: String,
    },
    /// Set the size of a file: `rext4 truncate -s SIZE IMAGE:/path` (SIZE in bytes, or with a
    /// K, M, G or T suffix; `+N` / `-N` grow or shrink by N). Creates the file if missing.
    Truncate {
        #[arg(short = 's', long, allow_hyphen_values = true)]
        size: String,
        target: String,
    },
    /// Make a directory: `rext4 mkdir [-p] IMAGE:/path`.
    Mkdir {
        /// Make missing parents too; no error if it exists.
        #[arg(short = 'p')]
        parents: bool,
        target: String,
    },
    /// Encrypt an empty directory under the first key given (`--key FILE`, or `--key-v1`), as
    /// `fscryptctl set_policy` does: everything made in it afterwards is encrypted. TARGET is
    /// `IMAGE:/dir`, or a directory on a rext4 mount (the key is added to the mount first).
    Encrypt {
        /// Names padded to this many bytes: 4, 8, 16 or 32.
        #[arg(long, default_value_t = 32)]
        padding: u8,
        target: String,
    },
    /// Encryption keys and policies on a mounted rext4 filesystem (`rext4 mount`), as
    /// `fscryptctl` handles them on kernel ext4.
    Key {
        #[command(subcommand)]
        action: KeyCmd,
    },
    /// Remove a file, or with -r a directory tree: `rext4 rm [-r] IMAGE:/path`.
    Rm {
        #[arg(short = 'r', short_alias = 'R')]
        recursive: bool,
        target: String,
    },
    /// Rename or move within an image: `rext4 mv IMAGE:/from IMAGE:/to`.
    Mv { from: String, to: String },
    /// Discard the image's free blocks (`fstrim` for an image not mounted): a sparse image
    /// file gets them punched out, so the host has the space back. Prints the bytes trimmed.
    Fstrim {
        image: PathBuf,
        /// Only free runs at least this many bytes long (K, M, G suffixes).
        #[arg(short = 'm', long = "minimum", default_value = "0")]
        minimum: String,
    },
    /// Make a hard link, or with -s a symbolic link: `rext4 ln [-s] TARGET IMAGE:/path`.
    Ln {
        #[arg(short = 's')]
        symbolic: bool,
        target: String,
        link: String,
    },
    /// Set or remove an extended attribute: `rext4 setfattr -n NAME [-v VALUE] IMAGE:/path`,
    /// `rext4 setfattr -x NAME IMAGE:/path`. VALUE is text, "quoted text", 0xHEX or 0sBASE64.
    Setfattr {
        #[arg(short = 'n', required_unless_present = "remove", conflicts_with = "remove")]
        name: Option<String>,
        #[arg(short = 'v', requires = "name")]
        value: Option<String>,
        #[arg(short = 'x')]
        remove: Option<String>,
        /// Act on a final symbolic link itself.
        #[arg(long)]
        no_dereference: bool,
        target: String,
    },
    /// Show extended attributes, all or one: `rext4 getfattr [-n NAME] [-e text|hex|base64]
    /// IMAGE:/path`.
    Getfattr {
        #[arg(short = 'n')]
        name: Option<String>,
        /// Dump every attribute (what getfattr without -n does here too; accepted as
        /// getfattr(1) users write it).
        #[arg(short = 'd', long = "dump")]
        _dump: bool,
        /// Names matching this pattern; only `-` (every namespace, the default) is taken.
        #[arg(short = 'm', value_parser = ["-", ".", ""])]
        _match: Option<String>,
        #[arg(short = 'e', value_enum, default_value = "text")]
        encoding: xattr_cmd::Encoding,
        /// Act on a final symbolic link itself.
        #[arg(long)]
        no_dereference: bool,
        target: String,
    },
    /// The engine's statistics for a filesystem served by `rext4 mount`: time and count per
    /// operation, lock waits, journal commit times.
    Stats {
        mountpoint: PathBuf,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Zero the operation and lock figures after reporting them.
        #[arg(long)]
        reset: bool,
    },
    /// Serve an image through FUSE: `rext4 mount IMAGE MOUNTPOINT [-o OPTIONS] [-f]` (see
    /// docs/fuse.md for the options).
    Mount {
        image: PathBuf,
        mountpoint: PathBuf,
        /// Comma-separated mount options: ro, rw, allow_other, default_permissions, commit=N,
        /// errors=continue|remount-ro, writeback_cache, io_uring/noio_uring, splice/nosplice,
        /// threads=N, fsname=, norecovery, cache=MiB, acl/noacl, the atime and sync options,
        /// and what ext4 and mount(8) accept (docs/fuse.md).
        #[arg(short = 'o', action = clap::ArgAction::Append)]
        options: Vec<String>,
        /// Stay in the foreground instead of daemonizing.
        #[arg(short = 'f')]
        foreground: bool,
        #[arg(long, hide = true)]
        daemon_child: bool,
    },
    /// Serve an empty in-memory filesystem through FUSE with `rext4 mount`'s settings, in the
    /// foreground: what a FUSE daemon costs on this machine (`rext4-bench --targets fusemem`).
    #[command(hide = true)]
    Memfs {
        mountpoint: PathBuf,
        /// Mount options, as for `rext4 mount` (threads=N, allow_other, ...).
        #[arg(short = 'o', action = clap::ArgAction::Append)]
        options: Vec<String>,
    },
    /// Copy out of an image (`rext4 cp [-r] IMAGE:/path HOSTDIR`) or into one
    /// (`rext4 cp [-r] HOSTPATH IMAGE:/path`).
    Cp {
        /// Copy directories recursively.
        #[arg(short = 'r', short_alias = 'R')]
        recursive: bool,
        /// Do not show a progress bar.
        #[arg(short = 'q', long)]
        quiet: bool,
        source: String,
        dest: String,
    },
}

fn main() -> ExitCode {
    // Run as `mount.fuse.rext4` by mount(8), or `umount.fuse.rext4` by umount(8).
    if let Some(code) = mount_helper::helper_main() {
        return code;
    }
    let mut cli = Cli::parse();
    let keys = cli.keys.iter().map(|k| ("key", k)).chain(cli.v1_keys.iter().map(|k| ("key_v1", k)));
    let keys = match keys.map(|(o, k)| rext4_fuse::load_key(o, k)).collect::<Result<Vec<_>, _>>() {
        Ok(k) => k,
        Err(e) => {
            eprintln!("rext4: {e}");
            return ExitCode::from(2);
        }
    };
    modify::set_open_args(cli.journal_device.clone(), keys);
    if let Cmd::Mount { options, .. } = &mut cli.cmd {
        if let Some(j) = &cli.journal_device {
            options.push(format!("journal_path={}", j.display()));
        }
        options.extend(cli.keys.iter().map(|k| format!("key={k}")));
        options.extend(cli.v1_keys.iter().map(|k| format!("key_v1={k}")));
    }
    // Reproducible builds: every time the command stamps is SOURCE_DATE_EPOCH.
    if let Some(t) = std::env::var("SOURCE_DATE_EPOCH").ok().and_then(|v| v.trim().parse().ok()) {
        rext4::clock::set_fixed_time(Some(t));
    }
    let r = match cli.cmd {
        Cmd::Demo { keep, files } => demo::run(keep, files),
        Cmd::Mkfs(a) => mkfs_cmd::run(&a),
        Cmd::Info { image } => inspect::info(&image),
        Cmd::Repquota { user, group, project, image } => {
            quota_cmd::repquota(&image, &quota_cmd::types(user, group, project))
        }
        Cmd::Setquota { user, group, project, times, args } => {
            let ty = quota_cmd::types(user, group, project)[0];
            match (times, &args[..]) {
                (true, [b, i, image]) => quota_cmd::setgrace(Path::new(image), ty, b, i),
                (false, [id, bs, bh, is, ih, image]) => {
                    quota_cmd::setquota(Path::new(image), ty, id, [bs, bh, is, ih])
                }
                (true, _) => Err("setquota -t takes BLOCK-GRACE INODE-GRACE IMAGE".into()),
                (false, _) => {
                    Err("setquota takes ID BLOCK-SOFT BLOCK-HARD INODE-SOFT INODE-HARD IMAGE".into())
                }
            }
        }
        Cmd::Ls { long, all, target } => inspect::ls(&target, long, all),
        Cmd::Cat { target } => inspect::cat(&target),
        Cmd::Chmod { mode, target } => modify::chmod(&mode, &target),
        Cmd::Mkdir { parents, target } => modify::mkdir(&target, parents),
        Cmd::Encrypt { padding, target } => modify::encrypt(&target, padding),
        Cmd::Key { action } => match action {
            KeyCmd::Add { quiet, path } => key_cmd::add(&path, &modify::given_keys(), quiet),
            KeyCmd::Remove { all_users, path, id } => key_cmd::remove(&path, &id, all_users),
            KeyCmd::Status { path, id } => key_cmd::status(&path, &id),
            KeyCmd::Policy { path } => key_cmd::policy(&path),
        },
        Cmd::Rm { recursive, target } => modify::rm(&target, recursive),
        Cmd::Mv { from, to } => modify::mv(&from, &to),
        Cmd::Fstrim { image, minimum } => modify::fstrim(&image, &minimum),
        Cmd::Ln { symbolic, target, link } => modify::ln(&target, &link, symbolic),
        Cmd::Chown { owner, target } => modify::chown(&owner, &target),
        Cmd::Touch { date, target } => modify::touch(date.as_deref(), &target),
        Cmd::Truncate { size, target } => modify::truncate(&size, &target),
        Cmd::Stat { target } => inspect::stat(&target),
        Cmd::Setfattr { name, value, remove, no_dereference, target } => match (name, remove) {
            (Some(name), _) => {
                xattr_cmd::setfattr(&xattr_cmd::Change::Set { name, value }, &target, !no_dereference)
            }
            (None, Some(name)) => {
                xattr_cmd::setfattr(&xattr_cmd::Change::Remove { name }, &target, !no_dereference)
            }
            (None, None) => Err("setfattr: give -n NAME or -x NAME".into()),
        },
        Cmd::Getfattr { name, encoding, no_dereference, target, .. } => {
            xattr_cmd::getfattr(name.as_deref(), encoding, &target, !no_dereference)
        }
        Cmd::Tree { target } => inspect::tree(&target),
        Cmd::Stats { mountpoint, json, reset } => stats_cmd::run(&mountpoint, json, reset),
        Cmd::Mount { image, mountpoint, options, foreground, daemon_child } => {
            mount_cmd::run(&image, &mountpoint, &options, foreground, daemon_child)
        }
        Cmd::Memfs { mountpoint, options } => {
            rext4_fuse::MountOptions::parse(&format!("rw,{}", options.join(",")))
                .and_then(|o| rext4_fuse::serve_memfs(&mountpoint, &o).map_err(|e| format!("memfs: {e}")))
        }
        Cmd::Cp { recursive, quiet, source, dest } => {
            if imagepath::ImagePath::parse(&source).is_ok() {
                cp::copy_out(&source, std::path::Path::new(&dest), recursive, quiet)
            } else if imagepath::ImagePath::parse(&dest).is_ok() {
                cp_in::copy_in(std::path::Path::new(&source), &dest, recursive, quiet)
            } else {
                Err("cp: one side must be IMAGE:/path".to_string())
            }
        }
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rext4: {e}");
            ExitCode::FAILURE
        }
    }
}
