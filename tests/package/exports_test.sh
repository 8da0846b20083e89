#!/usr/bin/env bash
# libgmjit exports the public API (include/gmjit, GMJIT_API) and nothing of its internals or of
# the fmt code compiled into it: those would be ABI by accident and could bind a caller's own
# fmt to the library's copy.
set -euo pipefail
lib="$1"
[ -f "$lib" ] || { echo "FAIL: $lib was not built" >&2; exit 1; }
symbols="$(nm -D --defined-only -C "$lib" | awk '{ $1 = ""; $2 = ""; sub(/^ +/, ""); print }')"
# Our internals' functions, data, type information and vtables. (libstdc++ gives its own
# templates default visibility explicitly, so the type information of std::future's internals
# over an engine type stays visible: harmless, and no function of ours.)
prefix='^((typeinfo( name)? for |vtable for )?)'
internal="$(grep -E "$prefix(gmjit::(engine|cache|codegen|testing)::|gmjit::Engine::Impl|fmt::)" <<<"$symbols" || true)"
if [ -n "$internal" ]; then
  echo "FAIL: libgmjit exports internals:" >&2
  head -20 <<<"$internal" >&2
  exit 1
fi
for needed in gmjit_engine_create gmjit_engine_create_ex gmjit_prepare gmjit_engine_get_counters gmjit_version "gmjit::Engine::forward(" "typeinfo for gmjit::Error"; do
  grep -qF -- "$needed" <<<"$symbols" || { echo "FAIL: libgmjit does not export $needed" >&2; exit 1; }
done
echo "ok: $(wc -l <<<"$symbols") symbols"
