# Fuzzers of mesh_text: the tokenizer.json loader (any bytes: an error or a vocabulary that
# validates and builds a tokenizer) and the encoders (any bytes: no crash; byte-level BPE
# round-trips every text without special tokens; the stream decoder only emits valid UTF-8), and
# a JSONL line of training data (an error naming the line, or a record whose tokens and loss
# spans are checked); a data file cut into byte ranges as training workers cut it (the ranges'
# records joined are the whole file's).
if(TARGET mesh_text)
  mesh_add_fuzzer(fuzz_tokenizer_json SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_tokenizer_json.cpp LIBS mesh_text)
  mesh_add_fuzzer(fuzz_tokenizer_encode SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_tokenizer_encode.cpp LIBS mesh_text)
  mesh_add_fuzzer(fuzz_text_records SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_text_records.cpp LIBS mesh_text)
  mesh_add_fuzzer(fuzz_data_ranges SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_data_ranges.cpp LIBS mesh_text)
endif()
