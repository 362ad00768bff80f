// SPDX-License-Identifier: MIT
//
// Storage for a process-lifetime object that is never destroyed.
//
// exit() runs the destructors of static objects while the process's other
// threads go on: the library's own (progress threads, the agent resumer)
// and the application's, which may be in the middle of a verb.  And the
// interposed close() and write() are called by anything, other libraries'
// destructors included, until the very end.  What those reach must outlive
// every static destructor, so it is kept in a NoDestructor, made on first
// use (which also makes it usable from other libraries' constructors,
// before this one's have run):
//
//   std::map<K, V> &registry() {
//       static NoDestructor<std::map<K, V>> r;
//       return *r;
//   }
//
// The object lives in static storage, so making it allocates nothing and
// cannot fail when T's default constructor cannot, and leak checkers still
// see what it points to.  Only for singletons: nothing here is ever freed.
#pragma once

#include <new>
#include <type_traits>
#include <utility>

namespace sroce {

template <class T>
class NoDestructor {
  public:
    template <class... Args>
    explicit NoDestructor(Args &&...args) noexcept(std::is_nothrow_constructible_v<T, Args...>) {
        ::new (static_cast<void *>(storage_)) T(std::forward<Args>(args)...);
    }
    NoDestructor(const NoDestructor &) = delete;
    NoDestructor &operator=(const NoDestructor &) = delete;

    T &operator*() noexcept { return *get(); }
    T *operator->() noexcept { return get(); }
    T *get() noexcept { return std::launder(reinterpret_cast<T *>(storage_)); }

  private:
    alignas(T) unsigned char storage_[sizeof(T)];
};

namespace detail {
struct WithDestructor {
    ~WithDestructor();
};
} // namespace detail
// The point of it: nothing for exit() to run.
static_assert(std::is_trivially_destructible_v<NoDestructor<detail::WithDestructor>>);

} // namespace sroce
