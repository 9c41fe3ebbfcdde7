# Third-party dependencies, all from Debian packages (scripts/setup.sh installs them).
find_package(Threads REQUIRED)
find_package(FlatBuffers REQUIRED CONFIG)
find_package(doctest REQUIRED CONFIG)
find_package(LLVM REQUIRED CONFIG HINTS /usr/lib/llvm-14/lib/cmake/llvm)
find_package(PkgConfig REQUIRED)

# LLVM Support (cl, Error/Expected, MemoryBuffer, raw_ostream, FormatVariadic, SHA256), static.
add_library(minfer_llvm_support INTERFACE)
target_include_directories(minfer_llvm_support SYSTEM INTERFACE ${LLVM_INCLUDE_DIRS})
target_compile_definitions(minfer_llvm_support INTERFACE ${LLVM_DEFINITIONS})
llvm_map_components_to_libnames(MINFER_LLVM_LIBS support)
target_link_libraries(minfer_llvm_support INTERFACE ${MINFER_LLVM_LIBS})
# GCC 12 at -O2/-O3 reports -Wmaybe-uninitialized inside LLVM 14's FormatProviders.h (formatv's
# HS variable) where it is inlined into our code; the header is not ours to change.
target_compile_options(minfer_llvm_support INTERFACE $<$<CXX_COMPILER_ID:GNU>:-Wno-maybe-uninitialized>)

# xxHash (checksums of artifact data segments).
find_path(XXHASH_INCLUDE_DIR xxhash.h REQUIRED)
find_library(XXHASH_LIBRARY NAMES libxxhash.a xxhash REQUIRED)
add_library(minfer_xxhash INTERFACE)
target_include_directories(minfer_xxhash SYSTEM INTERFACE ${XXHASH_INCLUDE_DIR})
target_link_libraries(minfer_xxhash INTERFACE ${XXHASH_LIBRARY})

# OpenSSL's libcrypto: SHA-256 of the source GGUF recorded in the artifact (SHA-NI accelerated: ~1.5 GB/s
# per core here, against ~0.24 GB/s for LLVM's portable SHA256, which made hashing a 7B GGUF the longest
# part of a compile).
find_path(CRYPTO_INCLUDE_DIR openssl/evp.h REQUIRED)
find_library(CRYPTO_LIBRARY NAMES libcrypto.a crypto REQUIRED)
add_library(minfer_crypto INTERFACE)
target_include_directories(minfer_crypto SYSTEM INTERFACE ${CRYPTO_INCLUDE_DIR})
target_link_libraries(minfer_crypto INTERFACE ${CRYPTO_LIBRARY} ${CMAKE_DL_LIBS} Threads::Threads)

# PCRE2 with Unicode properties (BPE pre-tokenizer regexes).
find_path(PCRE2_INCLUDE_DIR pcre2.h REQUIRED)
find_library(PCRE2_LIBRARY NAMES libpcre2-8.a pcre2-8 REQUIRED)
add_library(minfer_pcre2 INTERFACE)
target_include_directories(minfer_pcre2 SYSTEM INTERFACE ${PCRE2_INCLUDE_DIR})
target_compile_definitions(minfer_pcre2 INTERFACE PCRE2_CODE_UNIT_WIDTH=8 PCRE2_STATIC)
target_link_libraries(minfer_pcre2 INTERFACE ${PCRE2_LIBRARY})

# CUDA toolkit: NVRTC for the compiler only (the runtime dlopens libcuda.so.1 itself).
find_package(CUDAToolkit QUIET)
if(CUDAToolkit_FOUND)
  set(MINFER_HAVE_NVRTC ON)
else()
  set(MINFER_HAVE_NVRTC OFF)
  message(STATUS "minfer: CUDA toolkit not found; kernel images will not be compiled")
endif()

# cpp-httplib (minfer-server's HTTP): Debian builds it as a shared library with OpenSSL, zlib and brotli
# support; its header's class layouts depend on the same defines, which pkg-config's Cflags carry.
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
# Debian ships it only as that shared library (its httplib.h is the split header, declarations only), built
# against the shared libstdc++; there is no static form to link. So under MINFER_STATIC an executable using it
# links the shared libstdc++ too (one C++ runtime in the process, not a static copy beside the library's) and
# looks for libcpp-httplib.so.0.11 (and its brotli libraries) in ../lib beside its bin/, where
# scripts/device-pack.sh puts them; OpenSSL, zlib and the C++ runtime come from the other machine's system.
function(minfer_link_httplib target)
  target_link_libraries(${target} PRIVATE PkgConfig::HTTPLIB)
  if(MINFER_STATIC)
    get_target_property(options ${target} LINK_OPTIONS)
    if(options)
      list(REMOVE_ITEM options -static-libstdc++ -static-libgcc)
      set_target_properties(${target} PROPERTIES LINK_OPTIONS "${options}")
    endif()
    set_target_properties(${target} PROPERTIES BUILD_RPATH "\$ORIGIN/../lib")
  endif()
endfunction()

