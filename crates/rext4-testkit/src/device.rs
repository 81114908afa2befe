//! A block device wrapper with hooks on writes and flushes.

use std::io;

/// A write hook of [`HookedDevice`]: the bytes and the byte offset about to be written.
type WriteHook = Box<dyn Fn(&[u8], u64) + Send + Sync>;

/// A device that passes every call to `inner`, running a hook before each write and each
/// flush: tests watch, slow down or break the engine's I/O with it.
pub struct HookedDevice<D: ?Sized> {
    pub inner: std::sync::Arc<D>,
    on_write: WriteHook,
    on_flush: Box<dyn Fn() + Send + Sync>,
}

impl<D: rext4::dev::BlockDevice + ?Sized> HookedDevice<D> {
    pub fn new(inner: std::sync::Arc<D>) -> Self {
        HookedDevice { inner, on_write: Box::new(|_, _| {}), on_flush: Box::new(|| {}) }
    }

    pub fn on_write(mut self, f: impl Fn(&[u8], u64) + Send + Sync + 'static) -> Self {
        self.on_write = Box::new(f);
        self
    }

    pub fn on_flush(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_flush = Box::new(f);
        self
    }
}

impl<D: rext4::dev::BlockDevice + ?Sized> rext4::dev::BlockDevice for HookedDevice<D> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        (self.on_write)(buf, offset);
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        (self.on_flush)();
        self.inner.flush()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
}
