//! `rext4 repquota` and `rext4 setquota`: quota usage and limits of an image, as the quota
//! tools show and set them through `quotactl` on a mounted filesystem (which a FUSE mount does
//! not offer). Ids are numeric: an image's owners need not exist on this host.

use crate::modify::{read_options, writable_options};
use crate::CliResult;
use rext4::{Fs, QuotaEntry, QuotaLimits, QuotaType};
use std::path::Path;

/// The types `-u`, `-g`, `-P` pick (user when none is given).
pub(crate) fn types(user: bool, group: bool, project: bool) -> Vec<QuotaType> {
    let mut t = Vec::new();
    if user || !(group || project) {
        t.push(QuotaType::User);
    }
    if group {
        t.push(QuotaType::Group);
    }
    if project {
        t.push(QuotaType::Project);
    }
    t
}

fn type_name(ty: QuotaType) -> &'static str {
    match ty {
        QuotaType::User => "user",
        QuotaType::Group => "group",
        QuotaType::Project => "project",
    }
}

/// A grace period or what is left of one, as `repquota` prints it: days, else hours and
/// minutes.
fn span(secs: u64) -> String {
    if secs >= 86_400 {
        format!("{}days", secs.div_ceil(86_400))
    } else {
        format!("{:02}:{:02}", secs / 3600, (secs % 3600).div_ceil(60))
    }
}

/// What is left of a grace period ending at `end` ("" when none runs, "none" once over).
fn grace_left(end: u64, now: u64) -> String {
    match end {
        0 => String::new(),
        e if e <= now => "none".into(),
        e => span(e - now),
    }
}

fn row(e: &QuotaEntry, now: u64) -> String {
    let l = &e.limits;
    let kib = e.space.div_ceil(1024);
    let over = |used: u64, soft: u64, hard: u64| {
        if (hard != 0 && used > hard) || (soft != 0 && used > soft) {
            '+'
        } else {
            '-'
        }
    };
    format!(
        "#{:<9} {}{} {:>9} {:>9} {:>9} {:>6} {:>7} {:>7} {:>7} {:>6}",
        e.id,
        over(kib, l.space_soft_kib, l.space_hard_kib),
        over(e.inodes, l.inodes_soft, l.inodes_hard),
        kib,
        l.space_soft_kib,
        l.space_hard_kib,
        grace_left(e.space_grace_end, now),
        e.inodes,
        l.inodes_soft,
        l.inodes_hard,
        grace_left(e.inodes_grace_end, now),
    )
}

pub(crate) fn repquota(image: &Path, types: &[QuotaType]) -> CliResult {
    let fs = Fs::open_with(image, read_options()).map_err(|e| format!("{}: {e}", image.display()))?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut out = String::new();
    for &ty in types {
        let report = fs.quota_report(ty).map_err(|e| format!("{}: {e}", image.display()))?;
        let Some(r) = report else {
            return Err(format!("{}: no {} quota file", image.display(), type_name(ty)));
        };
        out.push_str(&format!("*** Report for {} quotas on {}\n", type_name(ty), image.display()));
        out.push_str(&format!(
            "Block grace time: {}; Inode grace time: {}\n",
            span(u64::from(r.space_grace)),
            span(u64::from(r.inodes_grace))
        ));
        out.push_str(&format!("{:<22}{:^31}{:^31}\n", "", "Block limits", "File limits"));
        out.push_str(&format!(
            "{:<14}{:>9} {:>9} {:>9} {:>6} {:>7} {:>7} {:>7} {:>6}\n",
            match ty {
                QuotaType::User => "User",
                QuotaType::Group => "Group",
                QuotaType::Project => "Project",
            },
            "used",
            "soft",
            "hard",
            "grace",
            "used",
            "soft",
            "hard",
            "grace"
        ));
        out.push_str(&"-".repeat(86));
        out.push('\n');
        for e in &r.entries {
            out.push_str(&row(e, now));
            out.push('\n');
        }
        out.push('\n');
    }
    print!("{out}");
    Ok(())
}

/// A block limit: KiB, or a size with a K, M, G or T suffix (`setquota`'s units).
fn kib(v: &str) -> CliResult<u64> {
    if v.bytes().last().is_some_and(|c| c.is_ascii_digit()) {
        return v.parse().map_err(|_| format!("invalid block limit: {v}"));
    }
    let bytes = crate::mkfs_cmd::parse_size(v, Some(1))?;
    Ok(bytes.div_ceil(1024))
}

pub(crate) fn setquota(image: &Path, ty: QuotaType, id: &str, limits: [&str; 4]) -> CliResult {
    let id: u32 = id.parse().map_err(|_| format!("invalid id (numeric): {id}"))?;
    let count = |v: &str| v.parse::<u64>().map_err(|_| format!("invalid inode limit: {v}"));
    let l = QuotaLimits {
        space_soft_kib: kib(limits[0])?,
        space_hard_kib: kib(limits[1])?,
        inodes_soft: count(limits[2])?,
        inodes_hard: count(limits[3])?,
    };
    let fs = Fs::open_with(image, writable_options()).map_err(|e| format!("{}: {e}", image.display()))?;
    let r = fs.set_quota_limits(ty, id, l);
    let closed = fs.unmount();
    r.map_err(|e| format!("{}: {e}", image.display()))?;
    closed.map_err(|e| format!("{}: {e}", image.display()))
}

/// A grace period: seconds, or a number with an s, m, h or d suffix (at most 2^32 - 1 s, what
/// the quota file holds).
fn grace(v: &str) -> CliResult<u32> {
    let (n, unit) = match v.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => (&v[..i], &v[i..]),
        None => (v, "s"),
    };
    let mul: u64 = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("invalid grace period (seconds, or with s, m, h, d): {v}")),
    };
    n.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .and_then(|s| u32::try_from(s).ok())
        .ok_or_else(|| format!("invalid grace period: {v}"))
}

/// `setquota -t`: the grace periods of quota file `ty`.
pub(crate) fn setgrace(image: &Path, ty: QuotaType, space: &str, inodes: &str) -> CliResult {
    let (space, inodes) = (grace(space)?, grace(inodes)?);
    let fs = Fs::open_with(image, writable_options()).map_err(|e| format!("{}: {e}", image.display()))?;
    let r = fs.set_quota_grace(ty, space, inodes);
    let closed = fs.unmount();
    r.map_err(|e| format!("{}: {e}", image.display()))?;
    closed.map_err(|e| format!("{}: {e}", image.display()))
}
