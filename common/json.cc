#include "common/json.h"

#include <cctype>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace muster {

std::string JsonQuote(absl::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
  return out;
}

void JsonWriter::BeforeValue() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (!first_.empty()) {
    if (!first_.back()) out_ += ',';
    first_.back() = false;
  }
}

JsonWriter& JsonWriter::BeginObject() {
  BeforeValue();
  out_ += '{';
  first_.push_back(true);
  return *this;
}

JsonWriter& JsonWriter::EndObject() {
  out_ += '}';
  first_.pop_back();
  return *this;
}

JsonWriter& JsonWriter::BeginArray() {
  BeforeValue();
  out_ += '[';
  first_.push_back(true);
  return *this;
}

JsonWriter& JsonWriter::EndArray() {
  out_ += ']';
  first_.pop_back();
  return *this;
}

JsonWriter& JsonWriter::Key(absl::string_view key) {
  BeforeValue();
  out_ += JsonQuote(key);
  out_ += ':';
  after_key_ = true;
  return *this;
}

JsonWriter& JsonWriter::String(absl::string_view value) {
  BeforeValue();
  out_ += JsonQuote(value);
  return *this;
}

JsonWriter& JsonWriter::Int(int64_t value) {
  BeforeValue();
  absl::StrAppend(&out_, value);
  return *this;
}

JsonWriter& JsonWriter::Double(double value) {
  BeforeValue();
  absl::StrAppend(&out_, absl::StrFormat("%.6g", value));
  return *this;
}

JsonWriter& JsonWriter::Bool(bool value) {
  BeforeValue();
  out_ += value ? "true" : "false";
  return *this;
}

namespace {

// Cursor over the input; every method reports errors with the byte offset.
class FlatParser {
 public:
  explicit FlatParser(absl::string_view text) : text_(text) {}

  absl::StatusOr<std::map<std::string, std::string>> Parse() {
    std::map<std::string, std::string> result;
    SkipSpace();
    if (!Consume('{')) return Error("expected '{'");
    SkipSpace();
    if (Consume('}')) return Finish(std::move(result));
    while (true) {
      SkipSpace();
      auto key = ParseString();
      if (!key.ok()) return key.status();
      SkipSpace();
      if (!Consume(':')) return Error("expected ':'");
      SkipSpace();
      absl::StatusOr<std::string> value;
      if (Peek() == '"') {
        value = ParseString();
      } else if (Peek() == '{' || Peek() == '[') {
        return Error("nested values are not supported");
      } else {
        value = ParseLiteral();
      }
      if (!value.ok()) return value.status();
      result[*key] = *value;
      SkipSpace();
      if (Consume(',')) continue;
      if (Consume('}')) return Finish(std::move(result));
      return Error("expected ',' or '}'");
    }
  }

 private:
  char Peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  bool Consume(char c) {
    if (Peek() != c) return false;
    ++pos_;
    return true;
  }
  void SkipSpace() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("JSON: ", what, " at offset ", pos_));
  }
  absl::StatusOr<std::map<std::string, std::string>> Finish(
      std::map<std::string, std::string> result) {
    SkipSpace();
    if (pos_ != text_.size()) return Error("trailing characters");
    return result;
  }

  absl::StatusOr<std::string> ParseString() {
    if (!Consume('"')) return Error("expected string");
    std::string out;
    while (pos_ < text_.size()) {
      char c = text_[pos_++];
      if (c == '"') return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= text_.size()) break;
      char e = text_[pos_++];
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'u': {
          if (pos_ + 4 > text_.size()) return Error("short \\u escape");
          unsigned code = 0;
          for (int i = 0; i < 4; ++i) {
            char h = text_[pos_++];
            if (!std::isxdigit(static_cast<unsigned char>(h))) return Error("bad \\u escape");
            code = code * 16 + (std::isdigit(static_cast<unsigned char>(h))
                                    ? h - '0'
                                    : std::tolower(static_cast<unsigned char>(h)) - 'a' + 10);
          }
          if (code > 0x7f) return Error("non-ASCII \\u escape not supported");
          out += static_cast<char>(code);
          break;
        }
        default:
          out += e;  // \" \\ \/
      }
    }
    return Error("unterminated string");
  }

  absl::StatusOr<std::string> ParseLiteral() {
    size_t start = pos_;
    while (pos_ < text_.size() &&
           (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '-' ||
            text_[pos_] == '+' || text_[pos_] == '.')) {
      ++pos_;
    }
    if (start == pos_) return Error("expected a value");
    return std::string(text_.substr(start, pos_ - start));
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<std::map<std::string, std::string>> ParseFlatJsonObject(absl::string_view text) {
  return FlatParser(text).Parse();
}

}  // namespace muster
