# transport: the frame decoder is the first thing that parses a peer's bytes.
mesh_add_fuzzer(fuzz_transport_frames SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_transport_frames.cpp
                LIBS mesh_transport)
