/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ThreadSanitizer's dynamic annotations, for copies into registered memory
 * that a peer's protocol orders with the application's own accesses
 * across processes or sockets, where TSan cannot follow (the kernel's
 * copies it does not see at all). KVT_TSAN is defined by the build under
 * ThreadSanitizer (CMakeLists.txt); without it they are nothing.
 */
#ifndef KVT_UTIL_TSAN_H
#define KVT_UTIL_TSAN_H

#ifdef KVT_TSAN
/* Defined by TSan's runtime. */
void AnnotateIgnoreReadsBegin(const char *file, int line);
void AnnotateIgnoreReadsEnd(const char *file, int line);
void AnnotateIgnoreWritesBegin(const char *file, int line);
void AnnotateIgnoreWritesEnd(const char *file, int line);
#define KVT_TSAN_IGNORE_WRITES_BEGIN()                                         \
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__)
#define KVT_TSAN_IGNORE_WRITES_END() AnnotateIgnoreWritesEnd(__FILE__, __LINE__)
#define KVT_TSAN_IGNORE_READS_BEGIN()                                          \
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__)
#define KVT_TSAN_IGNORE_READS_END() AnnotateIgnoreReadsEnd(__FILE__, __LINE__)
#else
#define KVT_TSAN_IGNORE_WRITES_BEGIN() ((void)0)
#define KVT_TSAN_IGNORE_WRITES_END() ((void)0)
#define KVT_TSAN_IGNORE_READS_BEGIN() ((void)0)
#define KVT_TSAN_IGNORE_READS_END() ((void)0)
#endif

#endif
