// Thread-safety annotations: Clang's static analysis of which lock guards what.
//
// Under Clang with -Wthread-safety (the project's clang build makes it an error) the compiler
// checks, at every use, that a member marked BATON_GUARDED_BY(mu_) is touched only with mu_
// held, that a function marked BATON_REQUIRES(mu_) is called only with mu_ held, and that one
// marked BATON_EXCLUDES(mu_) is not. Elsewhere every macro expands to nothing.
//
//   BATON_CAPABILITY(name)       on a class: its objects are locks (base/mutex.h's Mutex).
//   BATON_SCOPED_CAPABILITY      on a class: an RAII holder of a lock (MutexLock).
//   BATON_GUARDED_BY(mu)         on a member: read or written only with mu held.
//   BATON_PT_GUARDED_BY(mu)      on a pointer member: what it points to needs mu.
//   BATON_REQUIRES(mu...)        on a function: the caller holds mu (the *Locked() methods).
//   BATON_ACQUIRE(mu...)         on a function: takes mu and returns with it held.
//   BATON_TRY_ACQUIRE(ok, mu...) on a function: takes mu when it returns ok.
//   BATON_RELEASE(mu...)         on a function: releases mu, which the caller held.
//   BATON_EXCLUDES(mu...)        on a function: takes mu itself, so the caller must not hold it.
//   BATON_ASSERT_CAPABILITY(mu)  on a function: checks at run time that mu is held.
//   BATON_RETURN_CAPABILITY(mu)  on a function: returns a reference to mu.
//   BATON_ACQUIRED_BEFORE(mu...) / BATON_ACQUIRED_AFTER(mu...) on a lock member: the order in
//                                which locks are nested (checked with -Wthread-safety-beta).
//   BATON_NO_THREAD_SAFETY_ANALYSIS on a function: not analysed; for lock juggling the
//                                analysis cannot follow. Say why beside each use.
//
// The analysis is per function and does not look inside lambdas with the enclosing lock
// held: a condition-variable predicate that reads guarded state is written as a
// `while (!cond) cv.Wait(mu);` loop in the annotated function instead.
#pragma once

#if defined(__clang__)
#define BATON_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define BATON_THREAD_ANNOTATION_(x)
#endif

#define BATON_CAPABILITY(name) BATON_THREAD_ANNOTATION_(capability(name))
#define BATON_SCOPED_CAPABILITY BATON_THREAD_ANNOTATION_(scoped_lockable)
#define BATON_GUARDED_BY(x) BATON_THREAD_ANNOTATION_(guarded_by(x))
#define BATON_PT_GUARDED_BY(x) BATON_THREAD_ANNOTATION_(pt_guarded_by(x))
#define BATON_ACQUIRED_BEFORE(...) BATON_THREAD_ANNOTATION_(acquired_before(__VA_ARGS__))
#define BATON_ACQUIRED_AFTER(...) BATON_THREAD_ANNOTATION_(acquired_after(__VA_ARGS__))
#define BATON_REQUIRES(...) BATON_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define BATON_ACQUIRE(...) BATON_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define BATON_TRY_ACQUIRE(...) BATON_THREAD_ANNOTATION_(try_acquire_capability(__VA_ARGS__))
#define BATON_RELEASE(...) BATON_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define BATON_EXCLUDES(...) BATON_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
#define BATON_ASSERT_CAPABILITY(x) BATON_THREAD_ANNOTATION_(assert_capability(x))
#define BATON_RETURN_CAPABILITY(x) BATON_THREAD_ANNOTATION_(lock_returned(x))
#define BATON_NO_THREAD_SAFETY_ANALYSIS BATON_THREAD_ANNOTATION_(no_thread_safety_analysis)
