# mesh_text: text <-> tokens. Byte-level BPE and SentencePiece-style vocabularies from
# tokenizer.json (or filled by the GGUF reader), a streaming decoder, chat templates, and training
# data from text and JSONL files packed into rows (dataset columns are mesh_graph tensors).
# PCRE2 and nlohmann_json stay private: no public header includes them.
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
find_package(nlohmann_json REQUIRED)
find_package(fmt REQUIRED)

add_library(mesh_text STATIC
  ${CMAKE_CURRENT_LIST_DIR}/vocabulary.cpp
  ${CMAKE_CURRENT_LIST_DIR}/utf8.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pre_tokenizer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/bpe_encoder.cpp
  ${CMAKE_CURRENT_LIST_DIR}/spm_encoder.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer_json.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stream_decoder.cpp
  ${CMAKE_CURRENT_LIST_DIR}/chat_template.cpp
  ${CMAKE_CURRENT_LIST_DIR}/text_dataset.cpp
  ${CMAKE_CURRENT_LIST_DIR}/text_shard.cpp)
target_include_directories(mesh_text PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>)
target_link_libraries(mesh_text PUBLIC mesh_base mesh_graph PRIVATE PkgConfig::PCRE2 nlohmann_json::nlohmann_json fmt::fmt)
