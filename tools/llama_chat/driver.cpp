// llama.cpp's chat code (common/chat.cpp: the Jinja template, its format's parser) for one template file, driven by
// JSON lines on stdin: {"messages", "tools"?, "tool_choice"?, "parallel_tool_calls"?, "enable_thinking"?,
// "add_generation_prompt"?, "reasoning_format"?, "text"?, "is_partial"?} -> {"prompt", "format", "grammar",
// "grammar_lazy", "generation_prompt", "message"?} (the
// rendered prompt; with "text": that reply parsed into an OpenAI message), or {"error"}. Built by build.sh.
#include "chat.h"
#include "json.h"
#include <fstream>
#include <iostream>
#include <sstream>
#include <nlohmann/json.hpp>

using ojson = nlohmann::ordered_json;

int main(int argc, char ** argv) {
    std::ifstream f(argv[1]);
    std::stringstream ss; ss << f.rdbuf();
    auto tmpls = common_chat_templates_init(nullptr, ss.str(), "<bos>", "<eos>");
    std::string line;
    while (std::getline(std::cin, line)) {
        ojson out;
        try {
            auto in = ojson::parse(line);
            common_chat_templates_inputs inputs;
            inputs.messages = common_chat_msgs_parse_oaicompat(common_json::parse(in.at("messages").dump()));
            if (in.contains("tools")) inputs.tools = common_chat_tools_parse_oaicompat(common_json::parse(in["tools"].dump()));
            if (in.contains("tool_choice")) inputs.tool_choice = common_chat_tool_choice_parse_oaicompat(in["tool_choice"].get<std::string>());
            inputs.parallel_tool_calls = in.value("parallel_tool_calls", true);
            inputs.enable_thinking = in.value("enable_thinking", true);
            inputs.add_generation_prompt = in.value("add_generation_prompt", true);
            std::string rf = in.value("reasoning_format", "auto");
            inputs.reasoning_format = common_reasoning_format_from_name(rf);
            auto params = common_chat_templates_apply(tmpls.get(), inputs);
            out["prompt"] = params.prompt;
            out["format"] = common_chat_format_name(params.format);
            out["grammar"] = params.grammar;
            out["grammar_lazy"] = params.grammar_lazy;
            out["generation_prompt"] = params.generation_prompt;
            if (in.contains("text")) {
                common_chat_parser_params pp(params);
                pp.reasoning_format = inputs.reasoning_format;
                if (!params.parser.empty()) pp.parser.load(params.parser);
                auto msg = common_chat_parse(in["text"].get<std::string>(), in.value("is_partial", false), pp);
                out["message"] = ojson::parse(msg.to_json_oaicompat().dump());
            }
        } catch (const std::exception & e) {
            out["error"] = e.what();
        }
        std::cout << out.dump() << std::endl;
    }
}
