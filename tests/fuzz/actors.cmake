# Fuzzer of the node's message decoder and the engines that consume decoded peer messages (the
# generate request checks included).
mesh_add_fuzzer(fuzz_messages SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_messages.cpp LIBS mesh_node_core mesh_generation_core mesh_blob_core)
