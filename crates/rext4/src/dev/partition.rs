//! Partitions: one partition of a GPT or MBR disk, as a device of its own.
//!
//! A partition is an offset and a length over another device (an image file, an NBD export);
//! every access is checked against its bounds and passed on. The table is read once, at
//! open, and is untrusted: every start and length is checked against the disk before use.
//!
//! GPT tables are read by the `gptman` crate (headers and entry array checked by CRC, the
//! backup header used when the primary is damaged), after the header's entry count, entry
//! size and entry array location are checked here, so a hostile header cannot make it
//! allocate or compute without bound. MBR tables (four primary entries and the chain of
//! extended boot records for logical partitions 5, 6, ...) are a few fixed fields, read
//! here.
//!
//! A partition is chosen by a [`Selector`]: its number (`2`, as Linux numbers `sda2`), its
//! GPT name (`root`, or `label=root`), or its type (`type=linux`, a GPT type GUID, or an MBR
//! type byte such as `type=0x83`). A bare word that names no partition is tried as a type
//! alias, so `disk.img@root` finds the partition labelled `root`, or else the one of the
//! discoverable-partitions root type for this machine.

use crate::dev::BlockDevice;
use std::io::{self, Read, Seek, SeekFrom};
use std::sync::Arc;

/// How a partition is chosen (see the module documentation for the syntax).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// Its number: 1-4 for MBR primaries, 5 on for logical partitions, GPT entry index.
    Number(u32),
    /// Its GPT partition name; a bare word also falls back to a type alias.
    Label { name: String, or_type: bool },
    /// Its type: a GPT type GUID (or alias) or an MBR type byte.
    Type(String),
}

impl Selector {
    /// Parses `2`, `root`, `label=root`, `type=linux`, `type=0x83`,
    /// `type=0FC63DAF-8483-4772-8E79-3D69D8477DE4`.
    pub fn parse(s: &str) -> io::Result<Selector> {
        if s.is_empty() {
            return Err(invalid("empty partition selector".into()));
        }
        if let Some(name) = s.strip_prefix("label=") {
            return Ok(Selector::Label { name: name.into(), or_type: false });
        }
        if let Some(t) = s.strip_prefix("type=") {
            gpt_type(t).map(drop).or_else(|_| mbr_type(t).map(drop))?;
            return Ok(Selector::Type(t.into()));
        }
        if s.bytes().all(|b| b.is_ascii_digit()) {
            let n = s.parse().ok().filter(|&n| n > 0);
            return n.map(Selector::Number).ok_or_else(|| invalid(format!("no partition number {s}")));
        }
        Ok(Selector::Label { name: s.into(), or_type: true })
    }
}

impl std::fmt::Display for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Selector::Number(n) => write!(f, "{n}"),
            Selector::Label { name, .. } => write!(f, "label {name:?}"),
            Selector::Type(t) => write!(f, "type {t}"),
        }
    }
}

/// Which table a partition came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableKind {
    Gpt,
    Mbr,
}

/// One partition of a disk, as its table describes it (bounds checked against the disk).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionInfo {
    /// Its number (see [`Selector::Number`]).
    pub number: u32,
    /// Byte offset of its first byte on the disk.
    pub start: u64,
    /// Its length in bytes.
    pub len: u64,
    /// The table it came from.
    pub table: TableKind,
    /// GPT: the partition name ("" for MBR).
    pub label: String,
    /// GPT: the type GUID as text; MBR: the type byte as `0x83`.
    pub type_id: String,
}

/// A view of `len` bytes of `base` from byte `start`.
pub struct PartitionDevice {
    base: Arc<dyn BlockDevice>,
    /// [immutable]
    start: u64,
    /// [immutable]
    len: u64,
}

impl PartitionDevice {
    /// The bytes `[start, start + len)` of `base`; refused if they do not lie inside it.
    pub fn new(base: Arc<dyn BlockDevice>, start: u64, len: u64) -> io::Result<Self> {
        if start.checked_add(len).is_none_or(|e| e > base.size()) {
            return Err(invalid(format!("partition {start}+{len} lies past the end of the disk")));
        }
        Ok(PartitionDevice { base, start, len })
    }

    /// Opens the partition `sel` chooses on `base`.
    pub fn open(base: Arc<dyn BlockDevice>, sel: &Selector) -> io::Result<Self> {
        let parts = partitions(&*base)?;
        let p = select(&parts, sel)?;
        Self::new(base, p.start, p.len)
    }

    /// Where the partition starts on the disk, in bytes.
    pub fn start(&self) -> u64 {
        self.start
    }

    fn at(&self, offset: u64, n: usize) -> io::Result<u64> {
        offset
            .checked_add(n as u64)
            .filter(|&e| e <= self.len)
            .map(|_| self.start + offset)
            .ok_or_else(|| io::ErrorKind::UnexpectedEof.into())
    }
}

impl BlockDevice for PartitionDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.base.read_at(buf, self.at(offset, buf.len())?)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.base.write_at(buf, self.at(offset, buf.len())?)
    }
    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        let n: usize = bufs.iter().map(|b| b.len()).sum();
        self.base.write_vectored_at(bufs, self.at(offset, n)?)
    }
    fn write_from_file(&self, src: &std::fs::File, src_offset: u64, offset: u64, len: u64) -> io::Result<()> {
        let n = usize::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        self.base.write_from_file(src, src_offset, self.at(offset, n)?, len)
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let n = usize::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        self.base.discard(self.at(offset, n)?, len)
    }
    fn write_durable(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.base.write_durable(buf, self.at(offset, buf.len())?)
    }
    fn flush(&self) -> io::Result<()> {
        self.base.flush()
    }
    fn size(&self) -> u64 {
        self.len
    }
    fn release_claim(&self) {
        self.base.release_claim();
    }
    fn host_range(&self, offset: u64, len: u64) -> Option<(std::os::fd::BorrowedFd<'_>, u64)> {
        let at = self.at(offset, usize::try_from(len).ok()?).ok()?;
        self.base.host_range(at, len)
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

fn bad_table(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// The partition `sel` chooses among `parts`; an error names what there is.
pub fn select<'a>(parts: &'a [PartitionInfo], sel: &Selector) -> io::Result<&'a PartitionInfo> {
    let by_type = |t: &str| -> io::Result<Vec<&PartitionInfo>> {
        let (g, m) = (gpt_type(t).ok(), mbr_type(t).ok());
        if g.is_none() && m.is_none() {
            return Err(invalid(format!("unknown partition type {t:?}")));
        }
        Ok(parts
            .iter()
            .filter(|p| match p.table {
                TableKind::Gpt => g.as_deref() == Some(p.type_id.as_str()),
                TableKind::Mbr => m.map(|b| format!("{b:#04x}")).as_deref() == Some(p.type_id.as_str()),
            })
            .collect())
    };
    let found: Vec<&PartitionInfo> = match sel {
        Selector::Number(n) => parts.iter().filter(|p| p.number == *n).collect(),
        Selector::Label { name, or_type } => {
            let l: Vec<_> = parts.iter().filter(|p| p.label == *name).collect();
            if l.is_empty() && *or_type && (gpt_type(name).is_ok() || mbr_alias(name).is_some()) {
                by_type(name)?
            } else {
                l
            }
        }
        Selector::Type(t) => by_type(t)?,
    };
    match found[..] {
        [one] => Ok(one),
        [] => Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no partition with {sel} (the disk has: {})", describe(parts)),
        )),
        _ => Err(invalid(format!(
            "several partitions match {sel}; choose one by number ({})",
            describe(parts)
        ))),
    }
}

fn describe(parts: &[PartitionInfo]) -> String {
    if parts.is_empty() {
        return "no partitions".into();
    }
    let one = |p: &PartitionInfo| match p.label.as_str() {
        "" => format!("{} type {}", p.number, p.type_id),
        l => format!("{} {l:?} type {}", p.number, p.type_id),
    };
    parts.iter().map(one).collect::<Vec<_>>().join(", ")
}

/// The partitions of the disk `dev`: its GPT if it has one, else its MBR. A disk with neither
/// table is an error; so is a protective MBR whose GPT cannot be read.
pub fn partitions(dev: &dyn BlockDevice) -> io::Result<Vec<PartitionInfo>> {
    let mut sector0 = [0u8; 512];
    dev.read_at(&mut sector0, 0).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            bad_table("the disk is too small to hold a partition table".into())
        } else {
            e
        }
    })?;
    let mbr = mbr_entries(&sector0);
    match gpt_partitions(dev) {
        Ok(Some(p)) => return Ok(p),
        Ok(None) => {}
        Err(e) => {
            // A GPT header that is present but damaged is an error; an MBR disk simply has no
            // "EFI PART" signature.
            if mbr.as_ref().is_none_or(|m| m.iter().any(|e| e.kind == 0xEE)) {
                return Err(e);
            }
        }
    }
    let Some(primary) = mbr else {
        return Err(bad_table("no partition table (neither GPT nor MBR) on the disk".into()));
    };
    if primary.iter().any(|e| e.kind == 0xEE) {
        return Err(bad_table("protective MBR but no GPT on the disk".into()));
    }
    mbr_partitions(dev, &primary)
}

// ---- GPT ----

/// The GPT's partitions, `None` where neither sector size shows a GPT signature.
fn gpt_partitions(dev: &dyn BlockDevice) -> io::Result<Option<Vec<PartitionInfo>>> {
    let size = dev.size();
    let mut found = None;
    for ss in [512u64, 4096] {
        // The primary header at LBA 1, the backup at the last LBA: gptman reads either, so
        // both are checked before it does.
        let mut any = false;
        for lba in [1, (size / ss).saturating_sub(1)] {
            match check_gpt_header(dev, lba, ss)? {
                HeaderCheck::Absent => {}
                HeaderCheck::Ok => any = true,
                HeaderCheck::Bad(why) => return Err(bad_table(format!("GPT header at LBA {lba}: {why}"))),
            }
        }
        if any {
            found = Some(ss);
            break;
        }
    }
    let Some(ss) = found else { return Ok(None) };
    let mut r = DevReader { dev, pos: 0 };
    let gpt = gptman::GPT::read_from(&mut r, ss).map_err(|e| bad_table(format!("GPT: {e}")))?;
    let mut out = Vec::new();
    for (n, p) in gpt.iter() {
        if !p.is_used() {
            continue;
        }
        let bytes = |lba: u64| lba.checked_mul(ss);
        let range = (p.ending_lba >= p.starting_lba)
            .then(|| Some((bytes(p.starting_lba)?, bytes(p.ending_lba - p.starting_lba + 1)?)))
            .flatten()
            .filter(|&(s, l)| s.checked_add(l).is_some_and(|e| e <= size));
        let Some((start, len)) = range else {
            return Err(bad_table(format!("GPT partition {n} lies outside the disk")));
        };
        out.push(PartitionInfo {
            number: n,
            start,
            len,
            table: TableKind::Gpt,
            label: p.partition_name.as_str().to_string(),
            type_id: guid_text(&p.partition_type_guid),
        });
    }
    Ok(Some(out))
}

enum HeaderCheck {
    Absent,
    Ok,
    Bad(&'static str),
}

/// Limits on a GPT header's entry array (the kernel's `is_gpt_valid` takes only 128-byte
/// entries; 128 entries is the usual table, tools allow a few times more).
const GPT_ENTRY_SIZE: u32 = 128;
const GPT_MAX_ENTRIES: u32 = 4096;

/// Whether LBA `lba` (of `ss` bytes) holds a GPT header whose entry array gptman may read
/// without risk: 128-byte entries, a bounded count, the array inside the disk.
fn check_gpt_header(dev: &dyn BlockDevice, lba: u64, ss: u64) -> io::Result<HeaderCheck> {
    let mut h = [0u8; 92];
    let Some(at) = lba.checked_mul(ss).filter(|&a| lba > 0 && a + ss <= dev.size()) else {
        return Ok(HeaderCheck::Absent);
    };
    dev.read_at(&mut h, at)?;
    if &h[0..8] != b"EFI PART" {
        return Ok(HeaderCheck::Absent);
    }
    let le32 = |o: usize| u32::from_le_bytes([h[o], h[o + 1], h[o + 2], h[o + 3]]);
    let le64 = |o: usize| u64::from(le32(o)) | (u64::from(le32(o + 4)) << 32);
    let (entries_lba, count, entry_size) = (le64(72), le32(80), le32(84));
    if entry_size != GPT_ENTRY_SIZE {
        return Ok(HeaderCheck::Bad("partition entries are not 128 bytes"));
    }
    if count > GPT_MAX_ENTRIES {
        return Ok(HeaderCheck::Bad("too many partition entries"));
    }
    let fits = entries_lba
        .checked_mul(ss)
        .and_then(|s| s.checked_add(u64::from(count) * u64::from(entry_size)))
        .is_some_and(|e| e <= dev.size());
    if !fits {
        return Ok(HeaderCheck::Bad("partition entry array lies outside the disk"));
    }
    Ok(HeaderCheck::Ok)
}

/// `std::io` reading over a device, for gptman.
struct DevReader<'a> {
    dev: &'a dyn BlockDevice,
    pos: u64,
}

impl Read for DevReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.dev.size().saturating_sub(self.pos);
        let n = usize::try_from(left).map_or(buf.len(), |l| l.min(buf.len()));
        self.dev.read_at(&mut buf[..n], self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for DevReader<'_> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let base = match to {
            SeekFrom::Start(n) => Some(n),
            SeekFrom::End(d) => self.dev.size().checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = base.ok_or_else(|| invalid("seek out of range".into()))?;
        Ok(self.pos)
    }
}

/// GPT type aliases (the Discoverable Partitions Specification's names).
const GPT_ALIASES: &[(&str, &str)] = &[
    ("linux", "0FC63DAF-8483-4772-8E79-3D69D8477DE4"),
    ("esp", "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"),
    ("home", "933AC7E1-2EB4-4F13-B844-0E14E2AEF915"),
    ("srv", "3B8F8425-20E0-4F3B-907F-1A25A76F98E8"),
    ("var", "4D21B016-B534-45C2-A9FB-5C16E091FD2D"),
    ("tmp", "7EC6F557-3BC5-4ACA-B293-16EF5DF639D1"),
    ("root-x86-64", "4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709"),
    ("root-arm64", "B921B045-1DF0-41C3-AF44-4C6F280D3FAE"),
    ("root-x86", "44479540-F297-41B2-9AF7-D131D5F0458A"),
    ("root-riscv64", "72EC70A6-CF74-40E6-BD49-4BDA08E8F224"),
];

/// The root partition type of the machine this runs on.
const ROOT_ALIAS: &str = if cfg!(target_arch = "aarch64") {
    "root-arm64"
} else if cfg!(target_arch = "x86") {
    "root-x86"
} else if cfg!(target_arch = "riscv64") {
    "root-riscv64"
} else {
    "root-x86-64"
};

/// A GPT type, as an alias or GUID text, in upper-case GUID text.
fn gpt_type(t: &str) -> io::Result<String> {
    let t = if t.eq_ignore_ascii_case("root") { ROOT_ALIAS } else { t };
    if let Some((_, g)) = GPT_ALIASES.iter().find(|(a, _)| a.eq_ignore_ascii_case(t)) {
        return Ok((*g).to_string());
    }
    let hex: Vec<usize> = [8, 4, 4, 4, 12].to_vec();
    let groups: Vec<&str> = t.split('-').collect();
    let ok = groups.len() == 5
        && groups.iter().zip(&hex).all(|(g, &n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()));
    if ok {
        Ok(t.to_ascii_uppercase())
    } else {
        Err(invalid(format!("unknown GPT partition type {t:?}")))
    }
}

/// A GUID as text: the first three fields are stored little-endian.
fn guid_text(g: &[u8; 16]) -> String {
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02X}")).collect::<String>();
    let rev = |b: &[u8]| b.iter().rev().copied().collect::<Vec<u8>>();
    format!(
        "{}-{}-{}-{}-{}",
        hex(&rev(&g[0..4])),
        hex(&rev(&g[4..6])),
        hex(&rev(&g[6..8])),
        hex(&g[8..10]),
        hex(&g[10..16])
    )
}

// ---- MBR ----

/// One 16-byte MBR partition entry.
#[derive(Debug, Clone, Copy)]
struct MbrEntry {
    kind: u8,
    start: u32,
    sectors: u32,
}

const MBR_SECTOR: u64 = 512;
/// At most this many logical partitions are followed (the chain is untrusted).
const MAX_LOGICAL: u32 = 128;

fn mbr_alias(t: &str) -> Option<u8> {
    match t.to_ascii_lowercase().as_str() {
        "linux" | "root" => Some(0x83),
        "esp" => Some(0xEF),
        _ => None,
    }
}

/// An MBR type byte: `0x83`, `83` or an alias.
fn mbr_type(t: &str) -> io::Result<u8> {
    mbr_alias(t)
        .or_else(|| u8::from_str_radix(t.strip_prefix("0x").unwrap_or(t), 16).ok())
        .ok_or_else(|| invalid(format!("unknown MBR partition type {t:?}")))
}

/// The four entries of a boot sector, `None` without the 0x55AA signature.
fn mbr_entries(sector: &[u8; 512]) -> Option<[MbrEntry; 4]> {
    if sector[510..512] != [0x55, 0xAA] {
        return None;
    }
    let le32 = |o: usize| u32::from_le_bytes([sector[o], sector[o + 1], sector[o + 2], sector[o + 3]]);
    Some(std::array::from_fn(|i| {
        let o = 446 + 16 * i;
        MbrEntry { kind: sector[o + 4], start: le32(o + 8), sectors: le32(o + 12) }
    }))
}

fn is_extended(kind: u8) -> bool {
    matches!(kind, 0x05 | 0x0F | 0x85)
}

fn mbr_partitions(dev: &dyn BlockDevice, primary: &[MbrEntry; 4]) -> io::Result<Vec<PartitionInfo>> {
    let size = dev.size();
    let mut out = Vec::new();
    let mut push = |number: u32, base: u64, e: &MbrEntry| -> io::Result<()> {
        let start = (base + u64::from(e.start)) * MBR_SECTOR;
        let len = u64::from(e.sectors) * MBR_SECTOR;
        if start + len > size {
            return Err(bad_table(format!("MBR partition {number} lies outside the disk")));
        }
        out.push(PartitionInfo {
            number,
            start,
            len,
            table: TableKind::Mbr,
            label: String::new(),
            type_id: format!("{:#04x}", e.kind),
        });
        Ok(())
    };
    let mut extended = None;
    for (i, e) in (1u32..).zip(primary) {
        if e.kind == 0 || e.sectors == 0 {
            continue;
        }
        if is_extended(e.kind) {
            if extended.replace(*e).is_some() {
                return Err(bad_table("MBR has more than one extended partition".into()));
            }
            continue;
        }
        push(i, 0, e)?;
    }
    // Logical partitions: each extended boot record holds one partition (its start relative
    // to that record) and a link to the next record (relative to the extended partition).
    let Some(ext) = extended else { return Ok(out) };
    let ext_start = u64::from(ext.start);
    let ext_end = ext_start + u64::from(ext.sectors);
    let mut rel = 0u64;
    for number in 5..5 + MAX_LOGICAL {
        let ebr_lba = ext_start + rel;
        if ebr_lba >= ext_end || (ebr_lba + 1) * MBR_SECTOR > size {
            return Err(bad_table(format!(
                "MBR extended boot record for partition {number} lies outside the disk"
            )));
        }
        let mut sector = [0u8; 512];
        dev.read_at(&mut sector, ebr_lba * MBR_SECTOR)?;
        let Some([part, next, ..]) = mbr_entries(&sector) else {
            if number == 5 {
                return Ok(out); // An empty extended partition need not hold a record.
            }
            return Err(bad_table(format!(
                "MBR extended boot record for partition {number} has no signature"
            )));
        };
        if part.kind != 0 && part.sectors != 0 {
            push(number, ebr_lba, &part)?;
        }
        if next.start == 0 || !is_extended(next.kind) {
            return Ok(out);
        }
        if u64::from(next.start) <= rel {
            return Err(bad_table("MBR extended boot records loop back".into()));
        }
        rel = u64::from(next.start);
    }
    Err(bad_table(format!("more than {MAX_LOGICAL} logical partitions")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::MemDevice;

    fn entry(sector: &mut [u8], i: usize, kind: u8, start: u32, sectors: u32) {
        let o = 446 + 16 * i;
        sector[o + 4] = kind;
        sector[o + 8..o + 12].copy_from_slice(&start.to_le_bytes());
        sector[o + 12..o + 16].copy_from_slice(&sectors.to_le_bytes());
        sector[510] = 0x55;
        sector[511] = 0xAA;
    }

    #[test]
    fn selectors_parse() {
        assert_eq!(Selector::parse("2").unwrap(), Selector::Number(2));
        assert!(Selector::parse("0").is_err());
        assert!(Selector::parse("").is_err());
        assert_eq!(Selector::parse("root").unwrap(), Selector::Label { name: "root".into(), or_type: true });
        assert_eq!(Selector::parse("label=2").unwrap(), Selector::Label { name: "2".into(), or_type: false });
        assert_eq!(Selector::parse("type=0x83").unwrap(), Selector::Type("0x83".into()));
        assert!(Selector::parse("type=0FC63DAF-8483-4772-8E79-3D69D8477DE4").is_ok());
        assert!(Selector::parse("type=nonsense!").is_err());
    }

    #[test]
    fn guid_text_is_mixed_endian() {
        let mut g = [0u8; 16];
        g[..4].copy_from_slice(&[0xAF, 0x3D, 0xC6, 0x0F]);
        g[4..6].copy_from_slice(&[0x83, 0x84]);
        g[6..8].copy_from_slice(&[0x72, 0x47]);
        g[8..].copy_from_slice(&[0x8E, 0x79, 0x3D, 0x69, 0xD8, 0x47, 0x7D, 0xE4]);
        assert_eq!(guid_text(&g), gpt_type("linux").unwrap());
    }

    #[test]
    fn mbr_logical_chain() {
        // Disk of 64 sectors: primary 1 at 2+8, extended at 16+48 holding logicals at
        // EBR 16 (+1, 8 sectors) and EBR 32 (+2, 8 sectors).
        let mut d = vec![0u8; 64 * 512];
        entry(&mut d[..512], 0, 0x83, 2, 8);
        entry(&mut d[..512], 1, 0x05, 16, 48);
        entry(&mut d[16 * 512..17 * 512], 0, 0x83, 1, 8);
        entry(&mut d[16 * 512..17 * 512], 1, 0x05, 16, 16);
        entry(&mut d[32 * 512..33 * 512], 0, 0x82, 2, 8);
        let dev = MemDevice::new(d);
        let p = partitions(&dev).unwrap();
        let got: Vec<_> = p.iter().map(|p| (p.number, p.start / 512, p.len / 512)).collect();
        assert_eq!(got, [(1, 2, 8), (5, 17, 8), (6, 34, 8)]);
        assert_eq!(select(&p, &Selector::parse("type=0x82").unwrap()).unwrap().number, 6);
        // Two partitions of the Linux type: ambiguous.
        assert!(select(&p, &Selector::parse("type=linux").unwrap()).is_err());
        assert!(select(&p, &Selector::Number(3)).is_err());
    }

    #[test]
    fn hostile_mbr_is_refused() {
        // An EBR chain that points back at itself.
        let mut d = vec![0u8; 64 * 512];
        entry(&mut d[..512], 0, 0x05, 16, 48);
        entry(&mut d[16 * 512..17 * 512], 0, 0x83, 1, 8);
        entry(&mut d[16 * 512..17 * 512], 1, 0x05, 0x7FFF_FFFF, 16);
        assert!(partitions(&MemDevice::new(d.clone())).is_err());
        // A partition past the end, and one of u32::MAX sectors at u32::MAX.
        let mut e = vec![0u8; 64 * 512];
        entry(&mut e[..512], 0, 0x83, u32::MAX, u32::MAX);
        assert!(partitions(&MemDevice::new(e)).is_err());
        // No table at all.
        assert!(partitions(&MemDevice::new(vec![0u8; 4096])).is_err());
        assert!(partitions(&MemDevice::new(vec![0u8; 100])).is_err());
    }

    #[test]
    fn partition_device_bounds() {
        let base: Arc<dyn BlockDevice> = Arc::new(MemDevice::new((0..=255u8).collect()));
        let p = PartitionDevice::new(base.clone(), 16, 32).unwrap();
        let mut b = [0u8; 4];
        p.read_at(&mut b, 28).unwrap();
        assert_eq!(b, [44, 45, 46, 47]);
        assert!(p.read_at(&mut b, 29).is_err());
        assert!(p.write_at(&b, u64::MAX).is_err());
        p.write_vectored_at(&[&[1, 2], &[3]], 0).unwrap();
        base.read_at(&mut b, 16).unwrap();
        assert_eq!(b, [1, 2, 3, 19]);
        assert!(PartitionDevice::new(base.clone(), 250, 7).is_err());
        assert!(PartitionDevice::new(base, u64::MAX, 2).is_err());
    }
}
