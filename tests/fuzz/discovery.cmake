# Fuzzers of discovery's decoders of peer input: TXT records and peer exchange messages.
mesh_add_fuzzer(fuzz_discovery_txt SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_discovery_txt.cpp
  LIBS mesh_discovery_core)
mesh_add_fuzzer(fuzz_discovery_pex SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_discovery_pex.cpp
  LIBS mesh_discovery_core)
