/* What libgmjit exports: the declarations marked GMJIT_API (the public C and C++ API). The
 * library is built with hidden visibility, so its internals and the fmt code compiled into it
 * are neither part of its ABI nor able to clash with a caller's own copies. */
#ifndef GMJIT_EXPORT_H_
#define GMJIT_EXPORT_H_

#if defined(__GNUC__) || defined(__clang__)
#define GMJIT_API __attribute__((visibility("default")))
/* For what a GMJIT_API class declares but keeps internal (Engine::Impl). */
#define GMJIT_HIDDEN __attribute__((visibility("hidden")))
#else
#define GMJIT_API
#define GMJIT_HIDDEN
#endif

#endif /* GMJIT_EXPORT_H_ */
