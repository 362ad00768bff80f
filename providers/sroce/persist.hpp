// SPDX-License-Identifier: MIT
//
// Target-side persistence: what kind of memory an MR lives in, and how to
// make bytes written into it durable (IBTA FLUSH, write-commit).
//
// A registered range is classified once, at registration, because finding
// out is expensive (libpmem's lookup, /proc/self/maps, statfs); the class is
// then stored in the MR and the per-packet calls below only dispatch on it.
// Durability goes through PMDK's libpmem, which picks the right cache
// write-back and fence instructions for the CPU it runs on.
#pragma once

#include <cstddef>
#include <cstdint>

namespace sroce {

enum class MemClass : uint8_t {
    // Nothing survives power loss; "durable" can only mean globally visible.
    kVolatile,
    // A shared mapping of a regular file on a filesystem backed by storage:
    // durable once the page cache is written back (msync).
    kFile,
    // Persistent memory mapped directly (DAX): durable once the CPU caches
    // are written back and fenced, no kernel involved.
    kPmem,
};

const char *mem_class_name(MemClass c);

// Classifies [addr, addr+len).  Every byte must qualify for the range to get
// a durable class, so a range that runs from a file mapping into anonymous
// memory (or an unmapped hole) is kVolatile.
//  - kPmem when pmem_is_pmem() says the whole range is persistent memory.
//    libpmem only vouches for ranges mapped through pmem_map_file() (so in
//    this process's libpmem); a DAX file the application mapped itself falls
//    through to kFile, for which msync is still correct, only slower.
//  - kFile when every mapping covering the range is MAP_SHARED, of a regular
//    file that still exists under the name the kernel reports (a deleted
//    file's blocks are freed once unmapped, so nothing of it survives power
//    loss), on a filesystem that is not memory (tmpfs, ramfs, hugetlbfs...).
//  - kVolatile otherwise, including len == 0: there is nothing to vouch for,
//    and the caller must not be able to obtain a persistent MR that way.
// Not for the data path (asks /proc, may allocate); thread-safe.
MemClass classify_memory(const void *addr, size_t len);

// How classify_memory() finds the mappings: by asking the kernel for the one
// covering an address (PROCMAP_QUERY, Linux 6.11), falling back to reading
// /proc/self/maps where that query is missing; or, for tests, each way
// alone (kQueryOnly never falls back, so a broken query cannot pass as the
// reading's answer).
enum class MapsLookup { kQueryWhenAvailable, kQueryOnly, kReadMaps };
void set_maps_lookup(MapsLookup how);
// Whether this kernel answers PROCMAP_QUERY.
bool maps_query_available();

// Makes [addr, addr+len) durable for its class: kPmem writes back the cache
// lines and fences (pmem_persist); kFile fences, so that non-temporal stores
// still in write-combining buffers reach the page cache, then writes the
// covering pages back to storage (pmem_msync); kVolatile only fences, which
// is all global visibility needs.  Stores made before the call, by this
// thread, are covered.  Returns 0, or the errno of a failed msync (then the
// range is not reported to the hook).  len == 0 is a fence only.
int persist_range(MemClass cls, const void *addr, size_t len);

// Makes every earlier store of this thread globally visible, non-temporal
// ones included (a release fence orders ordinary stores only).
void visibility_fence();

// Copies with non-temporal stores, which bypass the caches: the placement
// used for "uncached" writes, so that a large write does not evict the
// working set and a later flush of persistent memory has no lines to write
// back.  Does not fence; persist_range() or visibility_fence() drains.
void copy_nontemporal(void *dst, const void *src, size_t len);

// A test persistence domain.  When installed, every successful
// persist_range() reports its (addr, len), and every visibility_fence()
// reports (nullptr, 0), to the hook before returning; a test keeps a shadow
// image of what would survive power loss from these reports alone.  The hook
// runs on the caller's thread (often the NIC progress thread) and must not
// call back into the engine.  Process-wide; install before traffic starts
// and remove (nullptr) after it stops, since a hook changing under running
// traffic may be called with the other hook's ctx.
using PersistHook = void (*)(void *ctx, const void *addr, size_t len);
void set_persist_hook(PersistHook hook, void *ctx);

} // namespace sroce
