//! Expert reads bypass the page cache: after reading a file through `DirectFile`, almost none of
//! its pages are resident (checked with `mincore`), while a buffered read of the same file leaves
//! them resident (the control that shows the check can fail).

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;

use strata_experts::direct::DirectFile;

const SIZE: usize = 32 << 20;

fn drop_from_page_cache(path: &Path) {
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: plain syscalls on an open descriptor.
    unsafe {
        libc::fdatasync(f.as_raw_fd());
        libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
}

/// Fraction of the file's pages in the page cache.
fn resident_fraction(path: &Path) -> f64 {
    let f = std::fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    let page = 4096;
    let mut vec = vec![0u8; len.div_ceil(page)];
    // SAFETY: a read-only shared mapping of an open file of `len` bytes, unmapped below; mincore
    // writes one byte per page into `vec`, which has that many.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        assert_eq!(libc::mincore(p, len, vec.as_mut_ptr()), 0);
        libc::munmap(p, len);
    }
    vec.iter().filter(|&&b| b & 1 == 1).count() as f64 / vec.len() as f64
}

#[test]
fn direct_reads_leave_the_page_cache_empty() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join(format!("page-cache-{}.bin", std::process::id()));
    {
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
        for _ in 0..SIZE >> 20 {
            f.write_all(&chunk).unwrap();
        }
        f.sync_all().unwrap();
    }
    drop_from_page_cache(&path);
    assert!(
        resident_fraction(&path) < 0.05,
        "could not empty the page cache for the test file"
    );

    let file = DirectFile::open(&path).unwrap();
    assert!(file.is_direct(), "O_DIRECT was refused on {}", path.display());
    // Expert-sized reads at unaligned offsets, covering the whole file.
    let mut offset = 123u64;
    while (offset as usize) < SIZE - (3 << 20) {
        let (buf, skip) = file.read_range(offset, 3 << 20).unwrap();
        assert_eq!(buf.as_slice()[skip], ((offset % (1 << 20)) % 251) as u8);
        offset += 3 << 20;
    }
    let direct = resident_fraction(&path);
    assert!(
        direct < 0.05,
        "direct reads left {:.0} % of the file in the page cache",
        direct * 100.0
    );

    // Control: the same file read normally is cached.
    let _ = std::fs::read(&path).unwrap();
    let buffered = resident_fraction(&path);
    assert!(
        buffered > 0.5,
        "control failed: a buffered read left only {:.0} % cached",
        buffered * 100.0
    );
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_read_past_the_end_is_an_error_naming_the_cause() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join(format!("short-{}.bin", std::process::id()));
    std::fs::write(&path, vec![7u8; 10_000]).unwrap();
    let file = DirectFile::open(&path).unwrap();
    let (buf, skip) = file.read_range(9_000, 1_000).unwrap();
    assert_eq!(&buf.as_slice()[skip..], &[7u8; 1_000][..]);
    let e = file.read_range(9_000, 2_000).err().unwrap().to_string();
    assert!(e.contains("truncated"), "{e}");
    std::fs::remove_file(&path).unwrap();
}
