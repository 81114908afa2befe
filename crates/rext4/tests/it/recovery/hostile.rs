//! Hostile journals: typed errors or a replay, never a panic or a hang; clear refusals.

use super::*;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Opens an in-memory image; must not panic. Returns the error, or walks the root if it opened.
fn try_open(img: Vec<u8>) -> Result<RecoveryReport, Error> {
    let dev = Arc::new(MemDevice::new(img));
    let fs = Fs::from_device(dev, Options::default())?;
    let _ = fs.read_dir("/").map(|d| d.count());
    Ok(fs.recovery().cloned().unwrap_or_default())
}

fn jsb_set(img: &mut [u8], jsb_off: usize, field: usize, v: u32) {
    img[jsb_off + field..jsb_off + field + 4].copy_from_slice(&v.to_be_bytes());
    // s_checksum (v3 journals check it).
    let mut sb = img[jsb_off..jsb_off + 1024].to_vec();
    sb[0xFC..0x100].fill(0);
    let c = rext4::format::checksum::crc32c(!0, &sb);
    img[jsb_off + 0xFC..jsb_off + 0x100].copy_from_slice(&c.to_be_bytes());
}

#[test]
fn hostile_journals_never_panic_or_hang() {
    let f = fixture(&CASES[0]);
    let bs = f.bs;
    let base = fs::read(&f.img).unwrap();
    let jblocks: Vec<u32> = (0..64).collect();
    let map = journal_blocks(&f.img, &jblocks);
    let jsb_off = map[0] as usize * bs;
    let log_off = |n: usize| map[n] as usize * bs;
    let started = Instant::now();

    // The superblock fields the kernel checks.
    let cases: [(&str, usize, u32, i32); 6] = [
        ("s_start past s_maxlen", 0x1C, 5000, libc::EUCLEAN),
        ("s_first 0", 0x14, 0, libc::EUCLEAN),
        ("s_maxlen beyond the inode", 0x10, 100_000, libc::EUCLEAN),
        ("unknown incompat feature", 0x28, 0x13 | 0x1000, libc::EUCLEAN),
        ("bad magic", 0x0, 0x1234, libc::EUCLEAN),
        ("block size mismatch", 0xC, 1024, libc::EUCLEAN),
    ];
    for (what, field, v, errno) in cases {
        let mut img = base.clone();
        jsb_set(&mut img, jsb_off, field, v);
        let e = try_open(img).expect_err(what);
        assert_eq!(e.errno(), errno, "{what}: {e}");
    }
    let mut img = base.clone();
    img[jsb_off + 0x200] ^= 1;
    assert_eq!(try_open(img).unwrap_err().errno(), libc::EBADMSG, "journal superblock checksum");
    // s_start 0 with needs_recovery: nothing to replay.
    let mut img = base.clone();
    jsb_set(&mut img, jsb_off, 0x1C, 0);
    assert_eq!(try_open(img).unwrap().transactions, 0);

    // A log of random bytes has no transaction.
    for seed in 1..=8u64 {
        let mut rng = Rng(seed * 0x9E37_79B9);
        let mut img = base.clone();
        for n in 1..64 {
            for b in img[log_off(n)..log_off(n) + bs].iter_mut() {
                *b = rng.next() as u8;
            }
        }
        assert_eq!(try_open(img).unwrap().transactions, 0, "seed {seed}");
    }

    // A ring of revoke blocks all carrying the expected sequence: refused, not looped on.
    {
        let mut img = base.clone();
        let ring = journal_blocks(&f.img, &(0..1024).collect::<Vec<u32>>());
        let seed = rext4::format::jbd2::journal_csum_seed(&uuid(&base, jsb_off));
        for &p in &ring[1..] {
            let o = p as usize * bs;
            img[o..o + bs].fill(0);
            img[o..o + 4].copy_from_slice(&0xC03B_3998u32.to_be_bytes());
            img[o + 4..o + 8].copy_from_slice(&5u32.to_be_bytes());
            img[o + 8..o + 12].copy_from_slice(&1u32.to_be_bytes());
            img[o + 12..o + 16].copy_from_slice(&16u32.to_be_bytes());
            let c = rext4::format::jbd2::tail_checksum(&img[o..o + bs], seed);
            img[o + bs - 4..o + bs].copy_from_slice(&c.to_be_bytes());
        }
        let e = try_open(img).unwrap_err();
        assert_eq!(e.errno(), libc::EUCLEAN, "{e}");
    }

    // Mutations of a real log: header fields, counts, tag flags, bytes.
    let mut outcomes: BTreeMap<String, u32> = BTreeMap::new();
    for seed in 1..=300u64 {
        let mut rng = Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1);
        let mut img = base.clone();
        for _ in 0..1 + rng.below(6) {
            let n = 1 + rng.below(14) as usize;
            let o = log_off(n);
            match rng.below(8) {
                0 => img[o + rng.below(bs as u64) as usize] ^= 1 << rng.below(8),
                1 => img[o + 4..o + 8].copy_from_slice(&(rng.below(8) as u32).to_be_bytes()),
                2 => img[o + 8..o + 12].copy_from_slice(&(1 + rng.below(4) as u32).to_be_bytes()),
                3 => {
                    img[o + 12..o + 16].copy_from_slice(&(rng.next() as u32 % (bs as u32 + 64)).to_be_bytes())
                }
                4 => {
                    // Tag flags of the first tags.
                    let t = o + 12 + 16 * rng.below(4) as usize;
                    img[t + 4..t + 8].copy_from_slice(&(rng.below(16) as u32).to_be_bytes());
                }
                5 => jsb_set(&mut img, jsb_off, 0x1C, rng.below(1100) as u32),
                6 => jsb_set(&mut img, jsb_off, 0x18, rng.below(6) as u32),
                _ => {
                    let (a, b) = (log_off(1 + rng.below(14) as usize), log_off(1 + rng.below(14) as usize));
                    let blk = img[a..a + bs].to_vec();
                    img[b..b + bs].copy_from_slice(&blk);
                }
            }
        }
        let t = Instant::now();
        match try_open(img) {
            Ok(r) => *outcomes.entry(format!("opened, {} transactions", r.transactions)).or_insert(0) += 1,
            Err(e) => *outcomes.entry(e.to_string()).or_insert(0) += 1,
        }
        assert!(t.elapsed() < Duration::from_secs(10), "seed {seed}: recovery took {:?}", t.elapsed());
    }
    eprintln!("hostile journals ({:?}): {outcomes:#?}", started.elapsed());
}

fn uuid(img: &[u8], jsb_off: usize) -> [u8; 16] {
    let mut u = [0u8; 16];
    u.copy_from_slice(&img[jsb_off + 0x30..jsb_off + 0x40]);
    u
}

#[test]
fn refusals_are_clear() {
    // needs_recovery with an external journal.
    let dir = scratch();
    let img = dir.path().join("img");
    Image::ext4("16M").features("^has_journal").build(&img);
    let mut b = read_block(&img, 0, 4096);
    let sb = 1024;
    let compat = u32::from_le_bytes([b[sb + 0x5C], b[sb + 0x5D], b[sb + 0x5E], b[sb + 0x5F]]) | 0x4;
    b[sb + 0x5C..sb + 0x60].copy_from_slice(&compat.to_le_bytes());
    let inc = fs_incompat(&img) | RECOVER;
    b[sb + 0x60..sb + 0x64].copy_from_slice(&inc.to_le_bytes());
    b[sb + 0xE4..sb + 0xE8].copy_from_slice(&0x0801u32.to_le_bytes());
    let c = rext4::format::checksum::crc32c(!0, &b[sb..sb + 0x3FC]);
    b[sb + 0x3FC..sb + 0x400].copy_from_slice(&c.to_le_bytes());
    write_at(&img, 0, &b);
    let e = open_err(&img);
    assert!(matches!(e, Error::Incompatible(_)), "{e}");
    assert!(e.to_string().contains("external"), "{e}");
    assert!(rext4::recover_image(&img).is_err());
}
