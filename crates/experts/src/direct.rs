//! Reading byte ranges of a file past the page cache: `O_DIRECT` on Linux (`F_NOCACHE` on macOS)
//! into 4 KiB-aligned buffers with positioned reads. Never mmap: demand paging is 5-15x slower for
//! the expert access pattern. Where the filesystem refuses direct I/O (tmpfs, some network
//! filesystems) the file is read buffered instead, and that is reported once.

use std::alloc::{alloc, dealloc, Layout};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// Alignment of buffers, offsets and lengths for direct I/O.
pub const ALIGN: usize = 4096;

/// A heap buffer aligned to [`ALIGN`].
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
    layout: Layout,
}

// SAFETY: the buffer is uniquely owned heap memory.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access is read-only through &self.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// The capacity of a buffer made for `len` bytes.
    pub fn capacity_for(len: usize) -> usize {
        len.div_ceil(ALIGN).max(1) * ALIGN
    }

    pub fn new(len: usize) -> AlignedBuf {
        let size = Self::capacity_for(len);
        let layout = Layout::from_size_align(size, ALIGN).expect("aligned layout");
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { alloc(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        AlignedBuf { ptr, len, layout }
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for layout.size() >= len bytes; the bytes were written by a read
        // before any caller sees them (or are zero-initialised below).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// A zeroed buffer of at least `len` bytes, all of them readable (`as_slice` is the whole
    /// capacity) and in memory (written once).
    pub fn zeroed(len: usize) -> AlignedBuf {
        let size = len.div_ceil(ALIGN).max(1) * ALIGN;
        let layout = Layout::from_size_align(size, ALIGN).expect("aligned layout");
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        let mut buf = AlignedBuf {
            ptr,
            len: size,
            layout,
        };
        buf.touch();
        buf
    }

    /// Writes every page once, so later reads into the buffer find its memory in place.
    pub fn touch(&mut self) {
        // One call for the whole range where the kernel has it (Linux 5.14+): 1.4-1.7x faster
        // than a fault per page.
        #[cfg(target_os = "linux")]
        // SAFETY: the range is this buffer's own page-aligned allocation.
        if unsafe { libc::madvise(self.ptr.cast(), self.layout.size(), libc::MADV_POPULATE_WRITE) } == 0 {
            return;
        }
        for page in self.as_mut_full().chunks_mut(ALIGN) {
            page[0] = 0;
        }
    }

    /// The buffer's start, for a read submitted elsewhere (io_uring) to fill.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }

    /// Declares the first `len` bytes filled (by a read submitted elsewhere).
    ///
    /// # Safety
    /// The first `len` bytes must have been written, and `len` must not exceed the capacity.
    pub unsafe fn set_len(&mut self, len: usize) {
        debug_assert!(len <= self.capacity());
        self.len = len;
    }

    /// Bytes the buffer can hold.
    pub fn capacity(&self) -> usize {
        self.layout.size()
    }

    fn as_mut_full(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for layout.size() bytes and uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `new`.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

/// How expert bytes are read: `Direct` (the default and the point of strata: a pool of reader
/// threads issuing direct `pread`s), `Uring` (the same direct reads submitted through one
/// io_uring by one thread, Linux only) or `Mmap` (demand paging through a shared mapping; kept
/// only so benchmarks can measure what it costs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IoMode {
    #[default]
    Direct,
    Uring,
    Mmap,
}

struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a read-only shared mapping; it is only read.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: mapped in `DirectFile::open_mmap` with this length.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

pub struct DirectFile {
    path: PathBuf,
    file: File,
    direct: bool,
    map: Option<Mapping>,
}

static REPORTED_BUFFERED: AtomicBool = AtomicBool::new(false);

fn report_buffered(path: &Path, why: &str) {
    if !REPORTED_BUFFERED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            "{}: direct I/O unavailable ({why}); reading through the page cache instead",
            path.display()
        );
    }
}

impl DirectFile {
    pub fn open(path: &Path) -> std::io::Result<DirectFile> {
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::fs::OpenOptionsExt;
            match std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
            {
                Ok(file) => {
                    return Ok(DirectFile {
                        path: path.to_path_buf(),
                        file,
                        direct: true,
                        map: None,
                    })
                }
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => report_buffered(path, "O_DIRECT refused"),
                Err(e) => return Err(e),
            }
        }
        let file = File::open(path)?;
        #[cfg(target_os = "macos")]
        {
            use std::os::fd::AsRawFd;
            // SAFETY: fcntl on an open descriptor.
            unsafe { libc::fcntl(file.as_raw_fd(), libc::F_NOCACHE, 1) };
            return Ok(DirectFile {
                path: path.to_path_buf(),
                file,
                direct: true,
                map: None,
            });
        }
        #[allow(unreachable_code)]
        Ok(DirectFile {
            path: path.to_path_buf(),
            file,
            direct: false,
            map: None,
        })
    }

    /// Opens the file in `mode`.
    pub fn open_mode(path: &Path, mode: IoMode) -> std::io::Result<DirectFile> {
        match mode {
            IoMode::Direct | IoMode::Uring => Self::open(path),
            IoMode::Mmap => Self::open_mmap(path),
        }
    }

    /// A shared read-only mapping of the whole file: reads page-fault their bytes in.
    fn open_mmap(path: &Path) -> std::io::Result<DirectFile> {
        use std::os::fd::AsRawFd;
        let file = File::open(path)?;
        let len = file.metadata()?.len() as usize;
        let map = if len == 0 {
            None
        } else {
            // SAFETY: mapping an open file read-only; the mapping is unmapped on drop.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    file.as_raw_fd(),
                    0,
                )
            };
            if ptr == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error());
            }
            Some(Mapping {
                ptr: ptr as *mut u8,
                len,
            })
        };
        Ok(DirectFile {
            path: path.to_path_buf(),
            file,
            direct: false,
            map,
        })
    }

    /// The descriptor reads go to (io_uring submissions name it).
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.file.as_raw_fd()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Reads `len` bytes at `offset`. Returns the aligned buffer and where the range starts in it.
    /// A file that ends before the range is an error (it was truncated or replaced).
    pub fn read_range(&self, offset: u64, len: usize) -> std::io::Result<(AlignedBuf, usize)> {
        let mut buf = AlignedBuf::new(0);
        let skip = self.read_range_into(offset, len, &mut buf)?;
        Ok((buf, skip))
    }

    /// Like [`DirectFile::read_range`], into `buf`, which is reused (grown when too small): a
    /// reader that keeps its buffer pays for fresh pages once, not at every read. Returns where
    /// the range starts in `buf`.
    pub fn read_range_into(&self, offset: u64, len: usize, buf: &mut AlignedBuf) -> std::io::Result<usize> {
        let want = Self::span(offset, len);
        if buf.capacity() < want {
            *buf = AlignedBuf::new(want);
        }
        let skip = self.read_into_slice(offset, len, &mut buf.as_mut_full()[..want])?;
        buf.len = skip + len;
        Ok(skip)
    }

    /// Bytes a read of `len` bytes at `offset` occupies in an aligned buffer (from the aligned
    /// start before `offset` to the aligned end after it).
    pub fn span(offset: u64, len: usize) -> usize {
        (Self::skip(offset) + len).div_ceil(ALIGN) * ALIGN
    }

    /// Where a direct read of a range at `offset` starts in its buffer (the aligned start before
    /// it is read too).
    pub fn skip(offset: u64) -> usize {
        (offset % ALIGN as u64) as usize
    }

    /// Like [`DirectFile::read_range_into`], into `dst`, which starts at an [`ALIGN`] boundary and
    /// holds at least [`DirectFile::span`] bytes. Returns where the range starts in `dst`.
    pub fn read_into_slice(&self, offset: u64, len: usize, dst: &mut [u8]) -> std::io::Result<usize> {
        if let Some(map) = &self.map {
            let end = offset as usize + len;
            if end > map.len
                || std::fs::metadata(&self.path)
                    .map(|m| (m.len() as usize) < end)
                    .unwrap_or(true)
            {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("the {len}-byte range at offset {offset} is past the end of the file (truncated or replaced?)"),
                ));
            }
            assert!(dst.len() >= len, "a {len}-byte read into {} bytes", dst.len());
            // SAFETY: [offset, end) lies inside the mapping (checked above); the copy faults the
            // pages in, which is what this mode exists to measure.
            unsafe { std::ptr::copy_nonoverlapping(map.ptr.add(offset as usize), dst.as_mut_ptr(), len) };
            return Ok(0);
        }
        let skip = Self::skip(offset);
        let start = offset - skip as u64;
        let want = Self::span(offset, len);
        assert!(
            (dst.as_ptr() as usize).is_multiple_of(ALIGN) && dst.len() >= want,
            "a direct read needs an aligned destination of {want} bytes"
        );
        let mut done = 0;
        while done < skip + len {
            let dst = &mut dst[done..want];
            let n = match self.file.read_at(dst, start + done as u64) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "file ends at {} bytes, before the {len}-byte range at offset {offset} (truncated or replaced?)",
                        start + done as u64
                    ),
                ));
            }
            done += n;
            // A short direct read ends at EOF on a non-aligned length; the loop above then reports
            // it if the range is not covered.
        }
        Ok(skip)
    }
}
