//! Large reads answered without copying their bytes through the daemon: where a file's blocks
//! lie written in the image file (`Fs::read_in_place`), the reply is spliced from the image's
//! page cache into /dev/fuse (vendored fuser's `ReplyData::data_spliced`). A read through
//! memory copies each byte three times (image to buffer, buffer to the kernel's page, page to
//! the reader); spliced, twice, as a read of kernel ext4 on a loop device does.
//!
//! Everything else (short reads, holes, delayed writes, inline data, devices that are no host
//! file, replies through FUSE over io_uring, the `nosplice` option) is read as before.

use crate::adapter::{ino_of, Adapter};
use fuser::{Errno, HostPiece, INodeNo, ReplyData};

impl Adapter {
    /// Answers the read of `len` bytes of `ino` at `offset` by splicing, where it can:
    /// `Ok(None)` once answered, `Ok(Some(reply))` to read it instead (the access time then
    /// still to set, as `touch` says), `Err` with the error to answer.
    pub(crate) fn read_spliced(
        &self,
        ino: INodeNo,
        offset: u64,
        len: usize,
        touch: &mut bool,
        reply: ReplyData,
    ) -> Result<Option<ReplyData>, (ReplyData, Errno)> {
        if !self.shared.opts.splice || !reply.can_splice() {
            return Ok(Some(reply));
        }
        let e = match ino_of(ino) {
            Ok(e) => e,
            Err(err) => return Err((reply, err)),
        };
        let mut slot = Some(reply);
        let r = self.fs().read_in_place(e, offset, len, *touch, |ranges| {
            let pieces: Vec<HostPiece<'_>> =
                ranges.iter().map(|r| HostPiece { fd: r.fd, offset: r.offset, len: r.len }).collect();
            // Cannot be None: taken once, here.
            if let Some(reply) = slot.take() {
                if let Err(back) = reply.data_spliced(&pieces) {
                    slot = Some(back);
                }
            }
        });
        match (r, slot) {
            (Ok(Some(())), None) => Ok(None),
            // Handed over but not spliced: the access time is set already.
            (Ok(Some(())), Some(reply)) => {
                *touch = false;
                Ok(Some(reply))
            }
            (Ok(None), Some(reply)) => Ok(Some(reply)),
            (Err(err), Some(reply)) => Err((reply, self.err(err))),
            // Answered, and the engine failed after (setting the access time): nothing to say.
            (_, None) => Ok(None),
        }
    }
}
