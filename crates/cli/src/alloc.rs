//! The process's allocator: the system's, except that on Linux buffers of 2 MiB and more (a
//! prompt's activations and products, expert buffers, weights read at load) are mappings of
//! their own, aligned to 2 MiB and asked to be backed by huge pages (`MADV_HUGEPAGE`: transparent
//! huge pages in `madvise` or `always` mode), and returned to the system when freed. A fresh
//! buffer faults in on first touch: with 4 KiB pages a 512-token prompt of a Qwen3-MoE-shaped
//! model took about 110,000 faults, the kernel threads writing their outputs faulting at once and
//! waiting on each other in the kernel; with 2 MiB pages one per 2 MiB.

use std::alloc::{GlobalAlloc, Layout, System};

/// Buffers from this size up are mappings of their own.
const HUGE: usize = 2 << 20;
const PAGE: usize = 4096;

pub struct Allocator;

/// Whether a block of this layout is one of [`Allocator`]'s own mappings.
fn mapped(layout: Layout) -> bool {
    cfg!(target_os = "linux") && layout.size() >= HUGE && layout.align() <= HUGE
}

/// The bytes a mapping of `size` spans.
fn span(size: usize) -> usize {
    size.div_ceil(PAGE) * PAGE
}

/// A zeroed mapping of `size` bytes aligned to [`HUGE`], null when refused.
#[cfg(target_os = "linux")]
unsafe fn map(size: usize) -> *mut u8 {
    let len = span(size);
    let reserve = len + HUGE;
    let p = libc::mmap(
        std::ptr::null_mut(),
        reserve,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
        -1,
        0,
    );
    if p == libc::MAP_FAILED {
        return std::ptr::null_mut();
    }
    let start = p as usize;
    let aligned = start.next_multiple_of(HUGE);
    if aligned > start {
        libc::munmap(p, aligned - start);
    }
    let end = aligned + len;
    if start + reserve > end {
        libc::munmap(end as *mut libc::c_void, start + reserve - end);
    }
    // A hint: where Linux has no huge pages the mapping stays in 4 KiB pages.
    libc::madvise(
        aligned as *mut libc::c_void,
        len / HUGE * HUGE,
        libc::MADV_HUGEPAGE,
    );
    aligned as *mut u8
}

#[cfg(target_os = "linux")]
unsafe fn unmap(ptr: *mut u8, size: usize) {
    libc::munmap(ptr.cast(), span(size));
}

#[cfg(not(target_os = "linux"))]
unsafe fn map(_: usize) -> *mut u8 {
    unreachable!("only Linux maps its own blocks")
}

#[cfg(not(target_os = "linux"))]
unsafe fn unmap(_: *mut u8, _: usize) {
    unreachable!("only Linux maps its own blocks")
}

// SAFETY: a block is a mapping of its own exactly when `mapped(layout)` (the same layout on its
// alloc, realloc and dealloc, as GlobalAlloc requires), aligned to HUGE (at least the layout's
// alignment) and zeroed by the system; every other block is `System`'s.
unsafe impl GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if mapped(layout) {
            return map(layout.size());
        }
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if mapped(layout) {
            return map(layout.size());
        }
        System.alloc_zeroed(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if mapped(layout) {
            return unmap(ptr, layout.size());
        }
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new = Layout::from_size_align_unchecked(new_size, layout.align());
        if !mapped(layout) && !mapped(new) {
            return System.realloc(ptr, layout, new_size);
        }
        let p = self.alloc(new);
        if !p.is_null() {
            std::ptr::copy_nonoverlapping(ptr, p, layout.size().min(new_size));
            self.dealloc(ptr, layout);
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Through the process's allocator (this test binary's too): large blocks aligned to 2 MiB,
    /// zeroed, contents kept across reallocs that cross the threshold both ways.
    #[test]
    fn large_blocks_are_aligned_zeroed_and_keep_their_contents() {
        let big = vec![0u8; HUGE + 12345];
        if cfg!(target_os = "linux") {
            assert!((big.as_ptr() as usize).is_multiple_of(HUGE));
        }
        assert!(big.iter().all(|&b| b == 0));
        // Grows from the system's heap into a mapping, then further, then back below.
        let mut v: Vec<u32> = (0..1000).collect();
        for n in [HUGE / 4 + 7, 3 * HUGE, 100] {
            v.resize(n, 0);
            v.shrink_to_fit();
            assert_eq!(v.len(), n);
            for (i, x) in v.iter().take(1000.min(n)).enumerate() {
                assert_eq!(*x, i as u32, "at {i} after resizing to {n}");
            }
            assert!(v[1000.min(n)..].iter().all(|&x| x == 0));
        }
        // An alignment above HUGE is the system's.
        let layout = Layout::from_size_align(HUGE, 2 * HUGE).unwrap();
        assert!(!mapped(layout));
        // SAFETY: a valid non-zero layout, freed with the same layout.
        unsafe {
            let p = Allocator.alloc(layout);
            assert!(!p.is_null() && (p as usize).is_multiple_of(2 * HUGE));
            Allocator.dealloc(p, layout);
        }
    }
}
