# Fuzzer of the node's message decoder and the engines that consume decoded peer messages.
mesh_add_fuzzer(fuzz_messages SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_messages.cpp LIBS mesh_node_core)
