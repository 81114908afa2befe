//! The folded form of names against e2fsprogs' own (`debugfs dx_hash -c -e utf8`, the tables
//! e2fsck checks casefolded directories with): every code point alone, and random strings of
//! letters, combining marks, ignorables and Hangul, whose hashes must be the same.

use rext4::format::casefold;
use rext4::format::hash::{dx_hash, HashAlgo};
use rext4_testkit::{tool, Image, Rng};
use std::io::Write;
use std::path::Path;

const SEED_UUID: &str = "01234567-89ab-cdef-0011-223344556677";

fn seed() -> [u32; 4] {
    let hex: String = SEED_UUID.chars().filter(|c| *c != '-').collect();
    let bytes: Vec<u8> = (0..16).map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap()).collect();
    std::array::from_fn(|i| u32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap()))
}

/// debugfs's hashes of `names` (folded), in order.
fn debugfs_hashes(img: &Path, names: &[String]) -> Vec<(u32, u32)> {
    let dir = img.parent().unwrap();
    let cmds = dir.join("cmds");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&cmds).unwrap());
    for n in names {
        writeln!(f, "dx_hash -c -e utf8 -h half_md4 -s {SEED_UUID} {n}").unwrap();
    }
    f.flush().unwrap();
    drop(f);
    let out = std::process::Command::new(tool("debugfs")).arg("-f").arg(&cmds).arg(img).output().unwrap();
    assert!(out.status.success(), "debugfs: {}", String::from_utf8_lossy(&out.stderr));
    let hashes: Vec<(u32, u32)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("Hash of "))
        .map(|l| {
            let (_, tail) = l.rsplit_once(" is 0x").unwrap();
            let (major, minor) = tail.split_once(" (minor 0x").unwrap();
            (
                u32::from_str_radix(major, 16).unwrap(),
                u32::from_str_radix(minor.trim_end_matches(')'), 16).unwrap(),
            )
        })
        .collect();
    assert_eq!(hashes.len(), names.len(), "debugfs answered every name");
    hashes
}

fn ours(name: &str) -> (u32, u32) {
    let folded = casefold::fold(name.as_bytes()).unwrap_or_else(|| name.as_bytes().to_vec());
    let h = dx_hash(&folded, HashAlgo::HalfMd4, seed());
    (h.major, h.minor)
}

/// What debugfs's command parser passes through unchanged.
fn plain(c: char) -> bool {
    !(c.is_ascii_control() || matches!(c, ' ' | '"' | '\\' | '#' | '\'' | '-'))
}

fn compare(names: &[String]) {
    let dir = tempfile::tempdir().unwrap();
    let img = Image::ext4("4M").features("casefold").build_in(dir.path(), "cf");
    let theirs = debugfs_hashes(&img, names);
    let mut wrong = Vec::new();
    for (name, want) in names.iter().zip(theirs) {
        let got = ours(name);
        // dx_hash moves the one major hash that collides with the end-of-directory cookie;
        // e2fsprogs' does not.
        if got != want && !(want.0 == 0xffff_fffe && got.0 == 0xffff_fffc) {
            let cps: Vec<String> = name.chars().map(|c| format!("U+{:04X}", u32::from(c))).collect();
            wrong.push(format!("{} ({got:x?} != {want:x?})", cps.join(" ")));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} names hash differently, e.g. {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(20)]
    );
}

/// Every Unicode scalar value, each between two letters (a folded form of one code point
/// covers its folding, decomposition, ignorability; the letters keep debugfs's parser away).
#[test]
fn every_code_point_folds_as_e2fsprogs_folds_it() {
    let names: Vec<String> = (0..=0x10_FFFFu32)
        .filter_map(char::from_u32)
        .filter(|&c| plain(c))
        .map(|c| format!("Q{c}z"))
        .collect();
    compare(&names);
}

/// Strings where order matters: combining marks of several classes around ignorables and
/// starters, Hangul syllables and jamo, letters with foldings to several code points.
#[test]
fn random_strings_fold_as_e2fsprogs_folds_them() {
    const POOL: &[u32] = &[
        0x41, 0x61, 0x49, 0xDF, 0xC5, 0x130, 0x131, 0x1E9E, 0x212B, 0x390, 0x1F88, 0xFB03, 0x301, 0x308,
        0x323, 0x327, 0x328, 0x31B, 0x345, 0x5B0, 0x5C1, 0x93C, 0x94D, 0x200B, 0x200D, 0xAD, 0xFE0F, 0xE0041,
        0xAC00, 0xD55C, 0x1100, 0x1161, 0x11A8, 0x3164, 0x1D15E, 0x1D160, 0x1D165, 0x0F73, 0x0F75, 0x0F81,
        0x2126, 0x3A9, 0x1C80, 0xA7C0, 0x10400, 0x16E40,
    ];
    let mut rng = Rng::new(0xca5e_f01d);
    let names: Vec<String> = (0..20_000)
        .map(|_| {
            let len = 1 + rng.below(8) as usize;
            let mut s = String::from("Q");
            for _ in 0..len {
                s.push(char::from_u32(POOL[rng.below(POOL.len() as u64) as usize]).unwrap());
            }
            s.push('z');
            s
        })
        .collect();
    compare(&names);
}
