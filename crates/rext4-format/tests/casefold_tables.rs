//! The committed casefolding tables are what `tools/gen_casefold.py` makes from the Unicode
//! Character Database (Debian's `unicode-data`, which `.ci/setup` installs): nobody edited the
//! generated file, and the script still makes it.

use std::path::Path;
use std::process::Command;

#[test]
fn tables_are_what_the_generator_makes() {
    let ucd = Path::new("/usr/share/unicode");
    assert!(
        ucd.join("DerivedAge.txt").exists(),
        "the Unicode Character Database is missing: apt-get install unicode-data"
    );
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .arg(here.join("tools/gen_casefold.py"))
        .arg(ucd)
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "gen_casefold.py: {}", String::from_utf8_lossy(&out.stderr));
    let committed = std::fs::read(here.join("src/casefold/tables.rs")).expect("tables.rs");
    assert!(out.stdout == committed, "src/casefold/tables.rs differs from the generator's output");
}
