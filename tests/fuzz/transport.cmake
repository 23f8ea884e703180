# The Initial fuzzer calls ngtcp2 itself.
find_package(PkgConfig REQUIRED)
pkg_check_modules(FUZZ_QUIC REQUIRED IMPORTED_TARGET libngtcp2 libngtcp2_crypto_gnutls)
# transport: the frame decoder is the first thing that parses a peer's bytes.
mesh_add_fuzzer(fuzz_transport_frames SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_transport_frames.cpp
                LIBS mesh_transport)
# transport: a connection's bulk streams under the receive budget, driven by a peer that obeys
# flow control but sends anything else it likes.
mesh_add_fuzzer(fuzz_bulk_receiver SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_bulk_receiver.cpp
                LIBS mesh_transport)
# transport: the join token a person pastes after `meshnode --join` (outside input).
mesh_add_fuzzer(fuzz_join_token SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_join_token.cpp
                LIBS mesh_transport)
# transport: what a stranger's first datagram meets (Initial header, Retry token, inbound gate).
mesh_add_fuzzer(fuzz_inbound_initial SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_inbound_initial.cpp
                LIBS mesh_transport PkgConfig::FUZZ_QUIC)
# transport: NAT traversal payloads (addresses, punch targets, relay envelopes, sealed boxes)
# and the relay sessions that refuse replayed boxes and hellos without the mesh secret.
mesh_add_fuzzer(fuzz_traversal SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_traversal.cpp
                LIBS mesh_transport)
