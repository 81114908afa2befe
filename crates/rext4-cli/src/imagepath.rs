//! `IMAGE:/path` arguments, written like scp's `host:path`.

use crate::CliResult;
use rext4::Fs;
use std::path::PathBuf;

/// An image and a path inside it.
pub(crate) struct ImagePath {
    pub image: PathBuf,
    pub path: String,
}

impl ImagePath {
    /// Splits at the first `:` that is followed by `/` or ends the argument (after the
    /// scheme of an NBD address: `nbd://host/export:/path`).
    pub(crate) fn parse(arg: &str) -> CliResult<Self> {
        let skip =
            if rext4::dev::address::is_nbd_uri(arg) { arg.find("://").map_or(0, |i| i + 3) } else { 0 };
        let at = arg
            .match_indices(':')
            .map(|(i, _)| i)
            .filter(|&i| i >= skip)
            .find(|&i| arg[i + 1..].is_empty() || arg[i + 1..].starts_with('/'))
            .ok_or_else(|| format!("{arg}: expected IMAGE:/path"))?;
        let path = if arg[at + 1..].is_empty() { "/".to_string() } else { arg[at + 1..].to_string() };
        Ok(ImagePath { image: PathBuf::from(&arg[..at]), path })
    }

    /// As [`ImagePath::parse`], and for commands that only read: an argument without
    /// `:/path` that names an existing file or block device is that image's root, so
    /// `rext4 ls disk.img` lists it; so does an NBD address or a partition
    /// (`disk.img@2`).
    pub(crate) fn parse_read(arg: &str) -> CliResult<Self> {
        Self::parse(arg).or_else(|e| {
            let is_image = std::fs::metadata(arg)
                .map(|m| {
                    use std::os::unix::fs::FileTypeExt;
                    m.is_file() || m.file_type().is_block_device()
                })
                .unwrap_or(false)
                || rext4::dev::Address::parse(std::path::Path::new(arg)).is_ok_and(|a| {
                    a.partition.is_some() || matches!(a.target, rext4::dev::address::Target::Nbd(_))
                });
            if is_image {
                Ok(ImagePath { image: PathBuf::from(arg), path: "/".into() })
            } else {
                Err(e)
            }
        })
    }

    /// Opens the image.
    pub(crate) fn open(&self) -> CliResult<Fs> {
        Fs::open_with(&self.image, crate::modify::read_options())
            .map_err(|e| format!("{}: {e}", self.image.display()))
    }

    /// The entries of directory `dir` other than its `.` and `..`, in on-disk order. Only
    /// the first entry of each dot name is the real one: a crafted image may hold more, and
    /// those are returned for the caller to judge.
    pub(crate) fn children(&self, fs: &Fs, dir: rext4::InodeNo) -> CliResult<Vec<rext4::DirEntry>> {
        fs.children(dir).map_err(|e| self.err(e))
    }

    /// Formats an error about this path.
    pub(crate) fn err(&self, e: impl std::fmt::Display) -> String {
        format!("{}:{}: {e}", self.image.display(), self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_like_scp() {
        let p = ImagePath::parse("disk.img:/etc/passwd").unwrap();
        assert_eq!(p.image, PathBuf::from("disk.img"));
        assert_eq!(p.path, "/etc/passwd");
        let p = ImagePath::parse("a:b.img:/x").unwrap();
        assert_eq!(p.image, PathBuf::from("a:b.img"));
        assert_eq!(p.path, "/x");
        assert_eq!(ImagePath::parse("disk.img:").unwrap().path, "/");
        assert!(ImagePath::parse("disk.img").is_err());
        let p = ImagePath::parse("nbd://localhost:10810/exp@2:/etc").unwrap();
        assert_eq!((p.image, p.path.as_str()), (PathBuf::from("nbd://localhost:10810/exp@2"), "/etc"));
        let p = ImagePath::parse("nbd+unix:///e?socket=/tmp/s.sock:/a").unwrap();
        assert_eq!((p.image, p.path.as_str()), (PathBuf::from("nbd+unix:///e?socket=/tmp/s.sock"), "/a"));
        assert!(ImagePath::parse("nbd://localhost/exp").is_err());
        assert_eq!(ImagePath::parse_read("nbd://localhost/exp").unwrap().path, "/");
    }
}
