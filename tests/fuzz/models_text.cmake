# Fuzzers of mesh_text: the tokenizer.json loader (any bytes: an error or a vocabulary that
# validates and builds a tokenizer) and the encoders (any bytes: no crash; byte-level BPE
# round-trips every text without special tokens; the stream decoder only emits valid UTF-8).
if(TARGET mesh_text)
  mesh_add_fuzzer(fuzz_tokenizer_json SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_tokenizer_json.cpp LIBS mesh_text)
  mesh_add_fuzzer(fuzz_tokenizer_encode SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_tokenizer_encode.cpp LIBS mesh_text)
endif()
