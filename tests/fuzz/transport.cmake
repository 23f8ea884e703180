# transport: the frame decoder is the first thing that parses a peer's bytes.
mesh_add_fuzzer(fuzz_transport_frames SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_transport_frames.cpp
                LIBS mesh_transport)
# transport: aes128_gcm opens every 1-RTT packet a peer sends (where the CPU has VAES); GnuTLS
# is the reference.
find_package(PkgConfig REQUIRED)
pkg_check_modules(FUZZ_GNUTLS REQUIRED IMPORTED_TARGET gnutls)
mesh_add_fuzzer(fuzz_aes_gcm SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_aes_gcm.cpp
                LIBS mesh_transport PkgConfig::FUZZ_GNUTLS)
