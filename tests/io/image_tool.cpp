// A test driver for tests/io/check_image.py: runs the library's decoding, resampling and augmentation on files the
// script made, so that Pillow (an independent implementation) can check every byte. One job per line of the jobs
// file; arrays travel as .npy (uint8).
//
//   decode IMAGE CHANNELS OUT.npy
//   region IMAGE CHANNELS Y0 X0 H W OUT.npy                         (decode_image_region; prints "ok ROW0 COL0 PARTIAL")
//   resize IN.npy Y0 X0 BOX_H BOX_W OUT_H OUT_W OUT.npy
//   center IN.npy SHORT CROP_H CROP_W OUT.npy                       (torchvision Resize(SHORT) + CenterCrop)
//   render IN.npy CROP OUT_H OUT_W PAD FLIP SEED EPOCH SAMPLE OUT.npy   (prints the geometry as one line)
//   geometry CROP SRC_H SRC_W OUT_H OUT_W SCALE_MIN SCALE_MAX RATIO_MIN RATIO_MAX PAD FLIP SEED EPOCH FIRST COUNT
//            (prints COUNT geometry lines)
//   header IMAGE                                                   (prints format height width channels cmyk)
// An Error prints "error: <message>" for that job and the tool goes on.
#include <renaissance/core/error.h>
#include <renaissance/io/augment.h>
#include <renaissance/io/image.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace renaissance::io;

struct Array {
  std::vector<std::int64_t> shape;
  std::vector<std::uint8_t> data;
};

std::vector<std::uint8_t> slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  return std::vector<std::uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

Array read_npy(const std::string& path) {
  const std::vector<std::uint8_t> b = slurp(path);
  if (b.size() < 10 || std::memcmp(b.data(), "\x93NUMPY", 6) != 0) throw std::runtime_error("not .npy: " + path);
  const std::size_t hlen = b[8] | (b[9] << 8);
  const std::string header(b.begin() + 10, b.begin() + 10 + static_cast<std::ptrdiff_t>(hlen));
  if (header.find("'|u1'") == std::string::npos) throw std::runtime_error("not uint8: " + path);
  Array a;
  const auto lp = header.find('('), rp = header.find(')');
  std::stringstream ss(header.substr(lp + 1, rp - lp - 1));
  std::string part;
  while (std::getline(ss, part, ','))
    if (part.find_first_not_of(' ') != std::string::npos) a.shape.push_back(std::stoll(part));
  a.data.assign(b.begin() + 10 + static_cast<std::ptrdiff_t>(hlen), b.end());
  return a;
}

void write_npy(const std::string& path, const std::vector<std::int64_t>& shape, const std::uint8_t* data,
               std::size_t n) {
  std::string dims;
  for (std::int64_t d : shape) dims += std::to_string(d) + ", ";
  std::string header = "{'descr': '|u1', 'fortran_order': False, 'shape': (" + dims + "), }";
  while ((10 + header.size() + 1) % 64) header += ' ';
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  f.write("\x93NUMPY\x01\x00", 8);
  const char len[2] = {static_cast<char>(header.size() & 0xff), static_cast<char>(header.size() >> 8)};
  f.write(len, 2);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n));
}

std::string geometry_line(const SampleGeometry& g) {
  return fmt::format("{} {} {} {} {} {} {} {} {} {} {}", g.box_y, g.box_x, g.box_h, g.box_w, g.virt_h, g.virt_w, g.top,
                     g.left, g.shift_y, g.shift_x, g.flip);
}

void job(const std::vector<std::string>& a) {
  std::vector<std::uint8_t> scratch;
  const std::string& cmd = a.at(0);
  if (cmd == "decode") {
    const std::vector<std::uint8_t> bytes = slurp(a.at(1));
    const Image img = decode_image(bytes.data(), bytes.size(), std::stoi(a.at(2)), a.at(1));
    write_npy(a.at(3), {img.height, img.width, img.channels}, img.pixels.data(), img.pixels.size());
    std::printf("ok\n");
  } else if (cmd == "header") {
    const std::vector<std::uint8_t> bytes = slurp(a.at(1));
    const ImageHeader h = read_image_header(bytes.data(), bytes.size(), a.at(1));
    std::printf("%s %lld %lld %d %d\n", image_format_name(h.format), static_cast<long long>(h.height),
                static_cast<long long>(h.width), h.channels, h.cmyk ? 1 : 0);
  } else if (cmd == "resize") {
    const Array in = read_npy(a.at(1));
    const std::int64_t oh = std::stoll(a.at(6)), ow = std::stoll(a.at(7)), c = in.shape.at(2);
    std::vector<std::uint8_t> out(static_cast<std::size_t>(oh * ow * c));
    resize_box(in.data.data(), in.shape[0], in.shape[1], c, std::stoll(a.at(2)), std::stoll(a.at(3)),
               std::stoll(a.at(4)), std::stoll(a.at(5)), out.data(), oh, ow, scratch);
    write_npy(a.at(8), {oh, ow, c}, out.data(), out.size());
    std::printf("ok\n");
  } else if (cmd == "center") {
    const Array in = read_npy(a.at(1));
    const std::int64_t ch = std::stoll(a.at(3)), cw = std::stoll(a.at(4)), c = in.shape.at(2);
    const ResizeCrop rc = resize_short_center_crop(in.shape[0], in.shape[1], std::stoll(a.at(2)), ch, cw);
    std::vector<std::uint8_t> out(static_cast<std::size_t>(ch * cw * c));
    resize_then_crop(in.data.data(), in.shape[0], in.shape[1], c, rc, out.data(), ch, cw, scratch);
    write_npy(a.at(5), {ch, cw, c}, out.data(), out.size());
    std::printf("ok\n");
  } else if (cmd == "region") {
    const std::vector<std::uint8_t> bytes = slurp(a.at(1));
    const ImageRegion r = decode_image_region(bytes.data(), bytes.size(), std::stoi(a.at(2)), a.at(1), std::stoll(a.at(3)),
                                              std::stoll(a.at(4)), std::stoll(a.at(5)), std::stoll(a.at(6)));
    const Image& img = r.image;
    write_npy(a.at(7), {img.height, img.width, img.channels}, img.pixels.data(), img.pixels.size());
    std::printf("ok %lld %lld %d\n", static_cast<long long>(r.row0), static_cast<long long>(r.col0),
                have_region_decode() ? 1 : 0);
  } else if (cmd == "render") {
    const Array in = read_npy(a.at(1));
    AugmentSpec s;
    s.crop = parse_crop_mode(a.at(2));
    s.out_h = std::stoll(a.at(3));
    s.out_w = std::stoll(a.at(4));
    s.crop_padding = std::stoll(a.at(5));
    s.horizontal_flip = a.at(6) == "1";
    const SampleGeometry g = sample_geometry(s, std::stoull(a.at(7)), std::stoll(a.at(8)), std::stoll(a.at(9)),
                                             in.shape[0], in.shape[1]);
    const std::int64_t c = in.shape.at(2);
    std::vector<std::uint8_t> out(static_cast<std::size_t>(s.out_h * s.out_w * c));
    render_sample(in.data.data(), in.shape[0], in.shape[1], c, g, s, out.data(), scratch);
    write_npy(a.at(10), {s.out_h, s.out_w, c}, out.data(), out.size());
    std::printf("%s\n", geometry_line(g).c_str());
  } else if (cmd == "geometry") {
    AugmentSpec s;
    s.crop = parse_crop_mode(a.at(1));
    const std::int64_t sh = std::stoll(a.at(2)), sw = std::stoll(a.at(3));
    s.out_h = std::stoll(a.at(4));
    s.out_w = std::stoll(a.at(5));
    s.scale_min = std::stod(a.at(6));
    s.scale_max = std::stod(a.at(7));
    s.ratio_min = std::stod(a.at(8));
    s.ratio_max = std::stod(a.at(9));
    s.crop_padding = std::stoll(a.at(10));
    s.horizontal_flip = a.at(11) == "1";
    const std::uint64_t seed = std::stoull(a.at(12));
    const std::int64_t epoch = std::stoll(a.at(13)), first = std::stoll(a.at(14)), count = std::stoll(a.at(15));
    std::string out;
    for (std::int64_t i = first; i < first + count; ++i)
      out += geometry_line(sample_geometry(s, seed, epoch, i, sh, sw)) + "\n";
    std::fputs(out.c_str(), stdout);
  } else {
    throw std::runtime_error("unknown job " + cmd);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s JOBS_FILE\n", argv[0]);
    return 2;
  }
  std::ifstream jobs(argv[1]);
  std::string line;
  while (std::getline(jobs, line)) {
    std::vector<std::string> a;
    std::stringstream ss(line);
    std::string w;
    while (ss >> w) a.push_back(w);
    if (a.empty()) continue;
    try {
      job(a);
    } catch (const renaissance::Error& e) {
      std::printf("error: %s\n", e.what());
    }
    std::fflush(stdout);
  }
  return 0;
}
